#include "trainer/rank_files.h"

#include <unistd.h>

#include <cstring>

#include "core/error.h"

namespace verl::trainer {
namespace fs = std::filesystem;
namespace {

// A rank's report: its host, its absolute directory and the files it wrote, NUL-separated in one
// fixed record (one all-gather).
constexpr size_t kRecord = 4096;

std::vector<std::string> split_record(const char* p) {
  std::vector<std::string> parts;
  for (size_t at = 0; at < kRecord && p[at] != '\0';) {
    parts.emplace_back(p + at, strnlen(p + at, kRecord - at));
    at += parts.back().size() + 1;
  }
  return parts;
}

}  // namespace

void verify_rank_files(dist::Communicator& comm, const fs::path& dir, int64_t step,
                       const std::vector<std::string>& wrote) {
  if (comm.world_size() == 1) return;
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  std::string record = std::string(host) + '\0' + fs::absolute(dir).string() + '\0';
  for (const auto& f : wrote) record += f + '\0';
  VERL_CHECK(record.size() < kRecord,
             "checkpoint step {}: rank {}'s report of {} files is over {} "
             "bytes",
             step, comm.rank(), wrote.size(), kRecord);
  std::vector<uint8_t> mine(kRecord, 0), all(kRecord * static_cast<size_t>(comm.world_size()));
  std::memcpy(mine.data(), record.data(), record.size());
  comm.all_gather<uint8_t>(mine, all);

  std::string why;  // rank 0's verdict; empty: every file is there
  if (comm.rank() == 0) {
    for (int r = 1; r < comm.world_size() && why.empty(); ++r) {
      const auto parts = split_record(reinterpret_cast<const char*>(all.data()) +
                                      kRecord * static_cast<size_t>(r));
      if (parts.size() < 2) continue;
      std::vector<std::string> missing;
      for (size_t i = 2; i < parts.size(); ++i)
        if (!fs::exists(dir / parts[i])) missing.push_back(parts[i]);
      if (missing.empty()) continue;
      const std::string where = parts[1] == fs::absolute(dir).string()
                                    ? fmt::format(
                                          "{} on its host {}, a directory of the same "
                                          "name that rank 0 (host {}) does not share",
                                          parts[1], parts[0], host)
                                    : fmt::format("{} (host {})", parts[1], parts[0]);
      why = fmt::format(
          "checkpoint step {} not published: rank {} wrote {} into {}, and {} is not in rank 0's "
          "{}; every rank must write into one run directory (trainer.default_local_dir on a file "
          "system all nodes share); the previous checkpoints are kept",
          step, r, fmt::join(missing, ", "), where, missing.size() == 1 ? "it" : "they",
          fs::absolute(dir).string());
    }
  }
  // Every rank learns the verdict, so the job stops as one with the same message.
  std::vector<uint8_t> verdict(kRecord, 0);
  std::memcpy(verdict.data(), why.data(), std::min(why.size(), kRecord - 1));
  comm.broadcast<uint8_t>(verdict, 0);
  const std::string said(reinterpret_cast<const char*>(verdict.data()),
                         strnlen(reinterpret_cast<const char*>(verdict.data()), kRecord));
  VERL_CHECK(said.empty(), "{}", said);
}

}  // namespace verl::trainer
