// VERL_DUMP: .npy writer and reader, the per-tag index, and the comparison of two dumps.
// The .npy layout (numpy.lib.format, version 1.0): "\x93NUMPY", major 1, minor 0, a little-endian
// uint16 header length, then a Python dict literal padded with spaces and ended by '\n' so that the
// data starts at a multiple of 64 bytes, then the raw little-endian fp32 data in C order.
#include "core/dump.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <set>

#include "core/dtype.h"
#include "core/error.h"

namespace verl::dump {
namespace fs = std::filesystem;
static_assert(std::endian::native == std::endian::little, ".npy data is written as '<f4'");

namespace {

constexpr char kMagic[] = "\x93NUMPY";  // 6 bytes + NUL
constexpr size_t kMagicLen = 6;

struct State {
  std::mutex mu;
  std::string dir;
  std::atomic<bool> on{false};
  // Names already in each tag's index.txt during this run; a tag absent here has not been written
  // yet, so its index is started afresh on the first write.
  std::map<std::string, std::set<std::string>, std::less<>> listed;

  State() {
    const char* s = std::getenv("VERL_DUMP");
    if (s && *s) {
      dir = s;
      on.store(true);
    }
  }
};

State& state() {
  static State s;
  return s;
}

// A name becomes a file name and an index line: keep it to one path component on one line.
void check_component(std::string_view what, std::string_view s) {
  VERL_CHECK(
      !s.empty() && s != "." && s != ".." && s.find_first_of("/\\\n\r") == std::string_view::npos,
      "dump: {} '{}' must be one non-empty path component without '/', '\\' or newlines", what, s);
}

int64_t checked_numel(std::span<const int64_t> shape, std::string_view what) {
  int64_t n = 1;
  for (int64_t d : shape) {
    VERL_CHECK(d >= 0, "{}: negative dimension {} in the shape", what, d);
    VERL_CHECK(d == 0 || n <= std::numeric_limits<int64_t>::max() / 4 / d, "{}: shape too large",
               what);
    n *= d;
  }
  return n;
}

std::string shape_str(std::span<const int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// The text after `'key':` in a .npy header dict, leading spaces skipped.
std::string_view value_of(std::string_view header, std::string_view key, const std::string& path) {
  const std::string pat = fmt::format("'{}':", key);
  size_t p = header.find(pat);
  VERL_CHECK(p != std::string_view::npos, "{}: .npy header has no '{}' ({})", path, key, header);
  std::string_view v = header.substr(p + pat.size());
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  return v;
}

std::vector<int64_t> parse_shape(std::string_view v, const std::string& path) {
  VERL_CHECK(!v.empty() && v.front() == '(', "{}: .npy shape is not a tuple", path);
  size_t close = v.find(')');
  VERL_CHECK(close != std::string_view::npos, "{}: .npy shape tuple is not closed", path);
  std::string_view body = v.substr(1, close - 1);
  std::vector<int64_t> shape;
  size_t i = 0;
  while (i < body.size()) {
    while (i < body.size() && (body[i] == ' ' || body[i] == ',')) ++i;
    if (i == body.size()) break;
    int64_t d = 0;
    size_t start = i;
    while (i < body.size() && body[i] >= '0' && body[i] <= '9') {
      VERL_CHECK(d <= (std::numeric_limits<int64_t>::max() - 9) / 10,
                 "{}: .npy dimension too large", path);
      d = d * 10 + (body[i++] - '0');
    }
    // numpy may write "3L" for longs in old Python 2 files.
    if (i < body.size() && body[i] == 'L') ++i;
    VERL_CHECK(i > start, "{}: cannot read the .npy shape '({})'", path, body);
    shape.push_back(d);
  }
  return shape;
}

bool agree(float ref, float val, double atol, double rtol) {
  if (ref == val) return true;  // also equal infinities
  if (std::isnan(ref) && std::isnan(val)) return true;
  const double d = std::fabs(double(val) - double(ref));
  return d <= atol + rtol * std::fabs(double(ref));  // false for NaN against a number
}

}  // namespace

bool enabled() {
  return state().on.load(std::memory_order_relaxed);
}

void set_dir(const std::string& d) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.dir = d;
  st.listed.clear();
  st.on.store(!d.empty());
}

std::string dir() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.dir;
}

void write_npy(const std::string& path, const float* data, std::span<const int64_t> shape) {
  const int64_t n = checked_numel(shape, path);
  VERL_CHECK(n == 0 || data, "{}: null data for {} elements", path, n);
  std::string dims = fmt::format("{}", fmt::join(shape, ", "));
  if (shape.size() == 1) dims += ',';  // a 1-tuple is "(5,)" in Python
  std::string header =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  const size_t unpadded = kMagicLen + 2 + 2 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  VERL_CHECK(header.size() <= 65535, "{}: shape {} too long for a .npy v1.0 header", path,
             shape_str(shape));
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  const char prefix[10] = {kMagic[0],
                           kMagic[1],
                           kMagic[2],
                           kMagic[3],
                           kMagic[4],
                           kMagic[5],
                           1,
                           0,
                           static_cast<char>(hlen & 0xff),
                           static_cast<char>(hlen >> 8)};

  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  VERL_CHECK(f, "dump: cannot open {} for writing", path);
  f.write(prefix, sizeof(prefix));
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  if (n > 0) f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * 4));
  f.close();
  VERL_CHECK(f, "dump: writing {} failed (disk full or not writable?)", path);
}

void tensor(std::string_view model_tag, std::string_view name, const float* data,
            std::span<const int64_t> shape) {
  if (!enabled()) return;
  check_component("model tag", model_tag);
  check_component("tensor name", name);
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.dir.empty()) return;  // turned off meanwhile
  const fs::path folder = fs::path(st.dir) / std::string(model_tag);
  const fs::path index = folder / "index.txt";
  auto tag = st.listed.find(model_tag);
  if (tag == st.listed.end()) {
    std::error_code ec;
    fs::create_directories(folder, ec);
    VERL_CHECK(!ec, "dump: cannot create {} ({}); check VERL_DUMP", folder.string(), ec.message());
    std::ofstream f(index, std::ios::trunc);  // a new run lists its own names only
    VERL_CHECK(f, "dump: cannot write {}; check VERL_DUMP", index.string());
    tag = st.listed.emplace(std::string(model_tag), std::set<std::string>{}).first;
  }
  write_npy((folder / (std::string(name) + ".npy")).string(), data, shape);
  if (tag->second.insert(std::string(name)).second) {
    std::ofstream f(index, std::ios::app);
    f << name << '\n';
    f.close();
    VERL_CHECK(f, "dump: cannot append to {}", index.string());
  }
}

void tensor(std::string_view model_tag, std::string_view name, const uint16_t* bf16_data,
            std::span<const int64_t> shape) {
  if (!enabled()) return;
  const int64_t n = checked_numel(shape, name);
  std::vector<float> wide(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) wide[i] = bf16_to_f32(bf16_data[i]);
  tensor(model_tag, name, wide.data(), shape);
}

std::vector<float> read(const std::string& path, std::vector<int64_t>* shape_out) {
  std::ifstream f(path, std::ios::binary);
  VERL_CHECK(f, "dump: cannot open {}", path);
  char prefix[8];
  f.read(prefix, sizeof(prefix));
  VERL_CHECK(f.gcount() == 8 && std::memcmp(prefix, kMagic, kMagicLen) == 0,
             "{}: not a .npy file (bad magic)", path);
  const int major = static_cast<unsigned char>(prefix[6]);
  VERL_CHECK(major >= 1 && major <= 3, "{}: unsupported .npy version {}.{}", path, major,
             int(static_cast<unsigned char>(prefix[7])));
  // v1.0 has a 2-byte header length; v2.0 and v3.0 a 4-byte one.
  unsigned char len_bytes[4] = {0, 0, 0, 0};
  const int nlen = major == 1 ? 2 : 4;
  f.read(reinterpret_cast<char*>(len_bytes), nlen);
  VERL_CHECK(f.gcount() == nlen, "{}: .npy file ends inside its header", path);
  const uint32_t hlen =
      len_bytes[0] | (len_bytes[1] << 8) | (len_bytes[2] << 16) | (uint32_t(len_bytes[3]) << 24);
  VERL_CHECK(hlen <= (1u << 24), "{}: .npy header length {} is implausible", path, hlen);
  std::string header(hlen, '\0');
  f.read(header.data(), hlen);
  VERL_CHECK(f.gcount() == static_cast<std::streamsize>(hlen),
             "{}: .npy file ends inside its header", path);

  std::string_view descr = value_of(header, "descr", path);
  VERL_CHECK(descr.substr(0, 5) == "'<f4'", "{}: dtype {} is not '<f4' (float32)", path,
             descr.substr(0, descr.find_first_of(",}")));
  std::string_view order = value_of(header, "fortran_order", path);
  VERL_CHECK(order.substr(0, 5) == "False", "{}: Fortran-order arrays are not supported", path);
  std::vector<int64_t> shape = parse_shape(value_of(header, "shape", path), path);

  const int64_t n = checked_numel(shape, path);
  std::vector<float> out(static_cast<size_t>(n));
  f.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n * 4));
  VERL_CHECK(f.gcount() == static_cast<std::streamsize>(n * 4),
             "{}: short file: shape {} needs {} bytes of data, found {}", path, shape_str(shape),
             n * 4, static_cast<int64_t>(f.gcount()));
  if (shape_out) *shape_out = std::move(shape);
  return out;
}

std::optional<Divergence> first_divergence(const std::string& ref_dir, const std::string& dir,
                                           double atol, double rtol) {
  const fs::path index = fs::path(ref_dir) / "index.txt";
  std::ifstream idx(index);
  VERL_CHECK(idx, "dump: cannot open {} (is {} a tag folder of a VERL_DUMP run, e.g. DIR/cpu?)",
             index.string(), ref_dir);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  int64_t compared = 0;
  std::string name;
  while (std::getline(idx, name)) {
    if (name.empty()) continue;
    const fs::path a = fs::path(ref_dir) / (name + ".npy"), b = fs::path(dir) / (name + ".npy");
    if (!fs::exists(a) || !fs::exists(b)) continue;
    std::vector<int64_t> ref_shape, shape;
    std::vector<float> ref = read(a.string(), &ref_shape);
    std::vector<float> val = read(b.string(), &shape);
    ++compared;
    if (ref_shape != shape) {
      return Divergence{
          name, -1, std::numeric_limits<double>::infinity(), nan, nan, compared, ref_shape, shape};
    }
    int64_t first = -1;
    double max_diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      if (agree(ref[i], val[i], atol, rtol)) {
        if (ref[i] != val[i] && !std::isnan(ref[i]))
          max_diff = std::max(max_diff, std::fabs(double(val[i]) - double(ref[i])));
        continue;
      }
      if (first < 0) first = static_cast<int64_t>(i);
      double d = std::fabs(double(val[i]) - double(ref[i]));
      max_diff = std::max(max_diff, std::isnan(d) ? std::numeric_limits<double>::infinity() : d);
    }
    if (first >= 0) {
      return Divergence{name, first, max_diff, ref[first], val[first], compared, ref_shape, shape};
    }
  }
  return std::nullopt;
}

std::string describe(const Divergence& d) {
  const int64_t agreeing = d.compared > 0 ? d.compared - 1 : 0;
  if (d.index < 0) {
    return fmt::format("first divergence at {}: shape {} vs {}, after {} names that agree", d.name,
                       shape_str(d.ref_shape), shape_str(d.shape), agreeing);
  }
  // The flat index as coordinates, e.g. [token, column] for a [T, C] tensor.
  std::string where;
  if (d.ref_shape.size() > 1) {
    std::vector<int64_t> coord(d.ref_shape.size());
    int64_t rest = d.index;
    for (size_t k = d.ref_shape.size(); k-- > 0;) {
      const int64_t dim = d.ref_shape[k] > 0 ? d.ref_shape[k] : 1;
      coord[k] = rest % dim;
      rest /= dim;
    }
    where = fmt::format(" (at {} of {})", shape_str(coord), shape_str(d.ref_shape));
  }
  return fmt::format(
      "first divergence at {}[{}]{}: {:.6g} vs {:.6g} (|diff| {:.2e}, max over the tensor {:.2e}), "
      "after {} names that agree",
      d.name, d.index, where, d.ref_value, d.value, std::fabs(d.value - d.ref_value),
      d.max_abs_diff, agreeing);
}

}  // namespace verl::dump
