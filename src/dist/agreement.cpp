#include "dist/agreement.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace verl::dist {
namespace {

// FNV-1a over name and value: equal pairs hash equal on every rank and platform.
int64_t item_hash(const std::string& name, const std::string& value) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // ends each part, so ("ab","c") differs from ("a","bc")
  };
  mix(name);
  mix(value);
  return static_cast<int64_t>(h);
}

// Every rank's `text`, cut to a fixed record so it is one all-gather.
std::vector<std::string> gather_text(Communicator& comm, const std::string& text) {
  constexpr size_t kRecord = 200;
  std::vector<uint8_t> mine(kRecord, 0), all(kRecord * static_cast<size_t>(comm.world_size()));
  const std::string cut = text.size() < kRecord ? text : text.substr(0, kRecord - 4) + "...";
  std::memcpy(mine.data(), cut.data(), cut.size());
  comm.all_gather<uint8_t>(mine, all);
  std::vector<std::string> out;
  for (int r = 0; r < comm.world_size(); ++r) {
    const char* p = reinterpret_cast<const char*>(all.data()) + kRecord * static_cast<size_t>(r);
    out.emplace_back(p, strnlen(p, kRecord));
  }
  return out;
}

}  // namespace

void check_same_on_every_rank(Communicator& comm,
                              std::span<const std::pair<std::string, std::string>> items,
                              const std::string& what) {
  if (comm.world_size() == 1) return;
  // The same build lists the same names; another build may not, and then names are all we have.
  std::vector<int64_t> n = {static_cast<int64_t>(items.size()),
                            -static_cast<int64_t>(items.size())};
  comm.all_reduce(std::span<int64_t>(n), ReduceOp::Max);
  VERL_CHECK(n[0] == -n[1],
             "{} on {}: the ranks list between {} and {} keys: every rank must run the same verl "
             "build",
             what, comm.describe_rank(), -n[1], n[0]);
  std::vector<int64_t> lo(items.size()), hi(items.size());
  for (size_t i = 0; i < items.size(); ++i)
    lo[i] = hi[i] = item_hash(items[i].first, items[i].second);
  comm.all_reduce(std::span<int64_t>(lo), ReduceOp::Min);
  comm.all_reduce(std::span<int64_t>(hi), ReduceOp::Max);
  std::vector<size_t> differ;
  for (size_t i = 0; i < items.size(); ++i)
    if (lo[i] != hi[i]) differ.push_back(i);
  if (differ.empty()) return;
  // Every rank knows which items differ; their values travel so that every rank's error is whole.
  constexpr size_t kShown = 8;
  std::vector<std::string> lines;
  for (size_t k = 0; k < std::min(differ.size(), kShown); ++k) {
    const auto& [name, value] = items[differ[k]];
    const std::vector<std::string> names = gather_text(comm, name);
    const std::vector<std::string> values = gather_text(comm, value);
    std::string per_rank;
    for (size_t r = 0; r < values.size(); ++r) {
      per_rank += fmt::format("{}{} on rank {}", r ? ", " : "", values[r], r);
      if (names[r] != name) per_rank += fmt::format(" (as {})", names[r]);
    }
    lines.push_back(fmt::format("{}: {}", name, per_rank));
  }
  VERL_FAIL(
      "{}: the ranks differ in {} key{}:\n  - {}{}\nevery rank must load the same "
      "configuration (only keys naming files and directories may differ)",
      what, differ.size(), differ.size() == 1 ? "" : "s", fmt::join(lines, "\n  - "),
      differ.size() > kShown ? fmt::format("\n  - ... and {} more", differ.size() - kShown) : "");
}

}  // namespace verl::dist
