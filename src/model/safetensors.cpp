// safetensors reading and writing. The parser follows the reference implementation's validation
// (huggingface/safetensors `Metadata::validate`): after sorting by begin offset the tensors must
// tile the data section exactly, and every byte range must equal numel x dtype size.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/json_depth.h"

namespace verl::model {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Same cap as the reference implementation: a larger header is almost surely corrupt.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

const char* json_type_name(const json& j) {
  return j.type_name();
}

// Reads a JSON integer that must be >= 0 and fit in int64 (shape dims and offsets).
uint64_t non_negative_int(const json& j, const std::string& source, const std::string& tensor,
                          const char* field) {
  VERL_CHECK(j.is_number_integer(), "{}: tensor '{}': {} must hold integers, got {} ({})", source,
             tensor, field, json_type_name(j), j.dump());
  // "-0" parses as a signed zero-valued integer; only a value below zero is negative.
  VERL_CHECK(j.is_number_unsigned() || j.get<int64_t>() >= 0,
             "{}: tensor '{}': {} holds negative value {}", source, tensor, field, j.dump());
  uint64_t v = j.get<uint64_t>();
  VERL_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
             "{}: tensor '{}': {} value {} is too large", source, tensor, field, v);
  return v;
}

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

// numel of a shape given by a writer; negative dims and overflow are rejected.
uint64_t checked_numel(const std::vector<int64_t>& shape, const std::string& what) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    VERL_CHECK(d >= 0, "{}: negative dimension in shape {}", what, shape_str(shape));
    VERL_CHECK(!__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n), "{}: shape {} overflows",
               what, shape_str(shape));
  }
  return n;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  VERL_CHECK(fd >= 0, "{}: cannot open safetensors file: {}", path, std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    int err = errno;
    ::close(fd);
    VERL_FAIL("{}: not a regular file ({})", path, std::strerror(err));
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {  // mmap of an empty file fails; report the real problem instead
    ::close(fd);
    VERL_FAIL("{}: file is {} bytes, shorter than the 8-byte header length field", path, size);
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  VERL_CHECK(map != MAP_FAILED, "{}: mmap of {} bytes failed: {}", path, size, std::strerror(err));

  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = map;  // owned from here on: the destructor unmaps even if parse throws
  f->map_size_ = size;
  f->parse(static_cast<const uint8_t*>(map), size);
  return f;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::from_memory(const uint8_t* bytes, size_t size,
                                                              const std::string& source) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = source;
  f->parse(bytes, size);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::parse(const uint8_t* bytes, size_t size) {
  const std::string& src = path_;
  VERL_CHECK(size >= 8, "{}: file is {} bytes, shorter than the 8-byte header length field", src,
             size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian on any host
  VERL_CHECK(n <= kMaxHeaderBytes, "{}: header length {} exceeds the {} byte limit (corrupt file?)",
             src, n, kMaxHeaderBytes);
  VERL_CHECK(n <= size - 8, "{}: header length {} runs past the end of the file ({} bytes)", src, n,
             size);
  const uint64_t data_size = size - 8 - n;
  const char* hbegin = reinterpret_cast<const char*>(bytes + 8);

  check_json_depth(std::string_view(hbegin, n), src + ": header");
  json header;
  try {
    header = json::parse(hbegin, hbegin + n);
  } catch (const json::exception& e) {
    VERL_FAIL("{}: header is not valid JSON: {}", src, e.what());
  }
  VERL_CHECK(header.is_object(), "{}: header must be a JSON object, got {}", src,
             json_type_name(header));

  std::vector<TensorInfo> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      VERL_CHECK(entry.is_object(), "{}: __metadata__ must be an object of strings, got {}", src,
                 json_type_name(entry));
      for (const auto& [k, v] : entry.items()) {
        VERL_CHECK(v.is_string(), "{}: __metadata__ key '{}' must be a string, got {}", src, k,
                   json_type_name(v));
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    VERL_CHECK(entry.is_object(), "{}: tensor '{}': entry must be an object, got {}", src, name,
               json_type_name(entry));
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      VERL_CHECK(entry.contains(key), "{}: tensor '{}': missing '{}'", src, name, key);
    }
    TensorInfo t;
    t.name = name;

    const json& jd = entry["dtype"];
    VERL_CHECK(jd.is_string(), "{}: tensor '{}': dtype must be a string, got {}", src, name,
               json_type_name(jd));
    const std::string ds = jd.get<std::string>();
    VERL_CHECK(dtype_from_name(ds, &t.dtype),
               "{}: tensor '{}': unknown or unsupported dtype '{}' (supported: F32, BF16, F16, "
               "I32, I64, U8)",
               src, name, ds);

    const json& js = entry["shape"];
    VERL_CHECK(js.is_array(), "{}: tensor '{}': shape must be an array, got {}", src, name,
               json_type_name(js));
    // Accumulate numel and the byte size with overflow checks: a crafted shape must not wrap
    // around to match a small byte range.
    uint64_t numel = 1;
    for (const json& d : js) {
      uint64_t v = non_negative_int(d, src, name, "shape");
      t.shape.push_back(static_cast<int64_t>(v));
      VERL_CHECK(!__builtin_mul_overflow(numel, v, &numel), "{}: tensor '{}': shape {} overflows",
                 src, name, js.dump());
    }
    uint64_t nbytes = 0;
    VERL_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &nbytes),
               "{}: tensor '{}': shape {} x {} bytes overflows", src, name, js.dump(),
               dtype_size(t.dtype));

    const json& jo = entry["data_offsets"];
    VERL_CHECK(jo.is_array() && jo.size() == 2,
               "{}: tensor '{}': data_offsets must be [begin, end], got {}", src, name, jo.dump());
    t.begin = non_negative_int(jo[0], src, name, "data_offsets");
    t.end = non_negative_int(jo[1], src, name, "data_offsets");
    VERL_CHECK(t.begin <= t.end, "{}: tensor '{}': data_offsets [{}, {}] has begin > end", src,
               name, t.begin, t.end);
    VERL_CHECK(t.end <= data_size,
               "{}: tensor '{}': data_offsets end {} is past the data section ({} bytes)", src,
               name, t.end, data_size);
    VERL_CHECK(t.end - t.begin == nbytes,
               "{}: tensor '{}': data_offsets [{}, {}] hold {} bytes but {} {} needs {}", src, name,
               t.begin, t.end, t.end - t.begin, ds, js.dump(), nbytes);
    tensors.push_back(std::move(t));
  }

  // Tensors must tile the data section: no overlap, no gap, nothing after the last one.
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    VERL_CHECK(t.begin >= expected, "{}: tensor '{}' [{}, {}] overlaps tensor '{}' [{}, {}]", src,
               t.name, t.begin, t.end, tensors[i - 1].name, tensors[i - 1].begin,
               tensors[i - 1].end);
    VERL_CHECK(
        t.begin == expected,
        "{}: gap of {} bytes in the data section before tensor '{}' (offset {}, expected {})", src,
        t.begin - expected, t.name, t.begin, expected);
    expected = t.end;
  }
  VERL_CHECK(expected == data_size,
             "{}: {} trailing bytes after the last tensor (data section is {} bytes, tensors end "
             "at {})",
             src, data_size - expected, data_size, expected);

  data_ = bytes + 8 + n;
  tensors_ = std::move(tensors);
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsDir

SafetensorsDir SafetensorsDir::open(const std::string& model_dir) {
  SafetensorsDir d;
  d.dir_ = model_dir;
  const fs::path dir(model_dir);
  VERL_CHECK(fs::is_directory(dir), "{}: model directory does not exist", model_dir);
  const fs::path single = dir / "model.safetensors";
  const fs::path index = dir / "model.safetensors.index.json";

  // Like transformers, a single model.safetensors wins over an index.
  if (fs::exists(single)) {
    d.files_.push_back(SafetensorsFile::open(single.string()));
    for (const TensorInfo& t : d.files_[0]->tensors()) d.where_[t.name] = 0;
    return d;
  }
  VERL_CHECK(fs::exists(index),
             "{}: neither model.safetensors nor model.safetensors.index.json found", model_dir);

  const std::string ipath = index.string();
  FILE* fp = std::fopen(ipath.c_str(), "rb");
  VERL_CHECK(fp, "{}: cannot open: {}", ipath, std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, fp)) > 0) text.append(buf, got);
  std::fclose(fp);

  check_json_depth(text, ipath);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    VERL_FAIL("{}: not valid JSON: {}", ipath, e.what());
  }
  VERL_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
             "{}: expected an object with a \"weight_map\" object", ipath);

  std::map<std::string, size_t> shard_index;  // shard file name -> index into files_
  for (const auto& [tensor, shard] : j["weight_map"].items()) {
    VERL_CHECK(shard.is_string(),
               "{}: weight_map entry for '{}' must be a file name string, got {}", ipath, tensor,
               json_type_name(shard));
    const std::string shard_name = shard.get<std::string>();
    auto it = shard_index.find(shard_name);
    if (it == shard_index.end()) {
      const fs::path sp = dir / shard_name;
      VERL_CHECK(fs::exists(sp), "{}: shard '{}' (holding tensor '{}') does not exist", ipath,
                 sp.string(), tensor);
      d.files_.push_back(SafetensorsFile::open(sp.string()));
      it = shard_index.emplace(shard_name, d.files_.size() - 1).first;
    }
    VERL_CHECK(d.files_[it->second]->find(tensor) != nullptr,
               "{}: names tensor '{}' in shard '{}', but that shard does not contain it", ipath,
               tensor, d.files_[it->second]->path());
    d.where_[tensor] = it->second;
  }
  return d;
}

bool SafetensorsDir::has(const std::string& name) const {
  return where_.count(name) != 0;
}

const TensorInfo& SafetensorsDir::info(const std::string& name) const {
  auto it = where_.find(name);
  VERL_CHECK(it != where_.end(), "{}: no tensor named '{}' in the model's safetensors", dir_, name);
  return *files_[it->second]->find(name);
}

const std::string& SafetensorsDir::file_of(const std::string& name) const {
  auto it = where_.find(name);
  VERL_CHECK(it != where_.end(), "{}: no tensor named '{}' in the model's safetensors", dir_, name);
  return files_[it->second]->path();
}

std::vector<std::string> SafetensorsDir::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, idx] : where_) out.push_back(name);
  return out;
}

void SafetensorsDir::read_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                              float* dst) const {
  const TensorInfo& t = info(name);
  const SafetensorsFile& f = *files_[where_.at(name)];
  VERL_CHECK(t.shape == expected_shape, "{}: tensor '{}' has shape {}, expected {}", f.path(), name,
             shape_str(t.shape), shape_str(expected_shape));
  VERL_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16,
             "{}: tensor '{}' has dtype {}; only F32, BF16 and F16 can be read as fp32", f.path(),
             name, dtype_name(t.dtype));
  const uint8_t* src = f.data(t);
  const size_t n = static_cast<size_t>(t.numel());
  const size_t isz = dtype_size(t.dtype);
  if (reinterpret_cast<uintptr_t>(src) % isz == 0) {
    convert_to_f32(dst, src, t.dtype, n);
    return;
  }
  // The format does not promise alignment (the header length need not be a multiple of 8), so
  // stage through an aligned buffer rather than read 16-bit values from an odd address.
  constexpr size_t kChunk = 1 << 16;
  std::vector<uint32_t> stage(kChunk * isz / sizeof(uint32_t) + 1);
  for (size_t i = 0; i < n; i += kChunk) {
    size_t m = std::min(kChunk, n - i);
    std::memcpy(stage.data(), src + i * isz, m * isz);
    convert_to_f32(dst + i, stage.data(), t.dtype, m);
  }
}

// ---------------------------------------------------------------------------------------------
// Writing

namespace {

// Bytes a tensor occupies when stored; validates the request.
uint64_t stored_bytes(const TensorToWrite& t, const std::string& path) {
  const std::string what = fmt::format("{}: tensor '{}'", path, t.name);
  VERL_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16,
             "{}: can only store F32, BF16 or F16 from fp32 data, asked for {}", what,
             dtype_name(t.dtype));
  uint64_t n = checked_numel(t.shape, what);
  VERL_CHECK(n == 0 || t.data != nullptr, "{}: data is null", what);
  uint64_t bytes = 0;
  VERL_CHECK(!__builtin_mul_overflow(n, static_cast<uint64_t>(dtype_size(t.dtype)), &bytes),
             "{}: byte size overflows", what);
  return bytes;
}

void write_all(FILE* fp, const void* p, size_t n, const std::string& path) {
  VERL_CHECK(std::fwrite(p, 1, n, fp) == n, "{}: write failed: {}", path, std::strerror(errno));
}

// Runs body(fp, tmp_path) on path.tmp, syncs it and renames it over `path`.
template <class WriteBody>
void write_atomically(const std::string& path, WriteBody&& body) {
  const std::string tmp = path + ".tmp";
  FILE* fp = std::fopen(tmp.c_str(), "wb");
  VERL_CHECK(fp, "{}: cannot create: {}", tmp, std::strerror(errno));
  try {
    body(fp, tmp);
    VERL_CHECK(std::fflush(fp) == 0 && ::fsync(fileno(fp)) == 0, "{}: flush failed: {}", tmp,
               std::strerror(errno));
  } catch (...) {
    std::fclose(fp);
    std::remove(tmp.c_str());
    throw;
  }
  VERL_CHECK(std::fclose(fp) == 0, "{}: close failed: {}", tmp, std::strerror(errno));
  VERL_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "{}: cannot rename to {}: {}", tmp, path,
             std::strerror(errno));
}

// True for names of the form model-DDDDD-of-DDDDD.safetensors (save_pretrained's shards).
bool is_shard_name(const std::string& s) {
  static const std::string pattern = "model-#####-of-#####.safetensors";
  if (s.size() != pattern.size()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    bool ok = pattern[i] == '#' ? (s[i] >= '0' && s[i] <= '9') : s[i] == pattern[i];
    if (!ok) return false;
  }
  return true;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps __metadata__ first and tensors in the caller's order.
  nlohmann::ordered_json header;
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    VERL_CHECK(t.name != "__metadata__" && !t.name.empty(), "{}: invalid tensor name '{}'", path,
               t.name);
    VERL_CHECK(seen.insert(t.name).second, "{}: tensor '{}' given twice", path, t.name);
    uint64_t bytes = stored_bytes(t, path);
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned.
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');

  write_atomically(path, [&](FILE* fp, const std::string& tmp) {
    uint8_t len[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    write_all(fp, len, 8, tmp);
    write_all(fp, text.data(), text.size(), tmp);
    // Convert in chunks so a large embedding does not need a second full-size copy.
    constexpr size_t kChunk = 1 << 16;
    std::vector<uint8_t> buf(kChunk * 4);
    for (const TensorToWrite& t : tensors) {
      const size_t numel = static_cast<size_t>(checked_numel(t.shape, t.name));
      const size_t isz = dtype_size(t.dtype);
      for (size_t i = 0; i < numel; i += kChunk) {
        size_t m = std::min(kChunk, numel - i);
        convert_from_f32(buf.data(), t.dtype, t.data + i, m);
        write_all(fp, buf.data(), m * isz, tmp);
      }
    }
  });
}

void write_safetensors_dir(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                           uint64_t max_shard_bytes) {
  const fs::path d(dir);
  std::error_code ec;
  fs::create_directories(d, ec);
  VERL_CHECK(fs::is_directory(d), "{}: cannot create directory: {}", dir, ec.message());
  VERL_CHECK(max_shard_bytes > 0, "{}: max_shard_bytes must be positive", dir);

  // Greedy packing in the given order, as transformers' shard_checkpoint: a tensor that does not
  // fit starts a new shard; one larger than the limit gets a shard of its own.
  std::vector<std::vector<TensorToWrite>> shards(1);
  uint64_t total = 0, in_shard = 0;
  std::set<std::string> seen;
  for (const TensorToWrite& t : tensors) {
    VERL_CHECK(seen.insert(t.name).second, "{}: tensor '{}' given twice", dir, t.name);
    uint64_t bytes = stored_bytes(t, dir);
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += bytes;
    total += bytes;
  }

  auto remove_stale_shards = [&](const std::set<std::string>& keep) {
    for (const auto& e : fs::directory_iterator(d)) {
      const std::string fname = e.path().filename().string();
      if (is_shard_name(fname) && !keep.count(fname)) fs::remove(e.path());
    }
  };

  if (shards.size() == 1) {
    write_safetensors((d / "model.safetensors").string(), shards[0]);
    fs::remove(d / "model.safetensors.index.json");
    remove_stale_shards({});
    return;
  }

  json weight_map = json::object();
  std::set<std::string> written;
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string fname =
        fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards.size());
    write_safetensors((d / fname).string(), shards[k]);
    for (const TensorToWrite& t : shards[k]) weight_map[t.name] = fname;
    written.insert(fname);
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const std::string ipath = (d / "model.safetensors.index.json").string();
  const std::string text = index.dump(2) + "\n";
  write_atomically(ipath, [&](FILE* fp, const std::string& tmp) {
    write_all(fp, text.data(), text.size(), tmp);
  });
  // A leftover single file would win over the index at load time.
  fs::remove(d / "model.safetensors");
  remove_stale_shards(written);
}

}  // namespace verl::model
