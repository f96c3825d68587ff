// `verl doctor`'s report: one line per check, PASS / WARN / FAIL, what was found and after "->"
// what to do; and the small helpers every group of checks uses.
#include <fmt/format.h>

#include <cstdlib>
#include <fstream>

#include "cli/doctor/doctor.h"

namespace verl::cli::doctor {

void Report::print(std::ostream& out, int rank) const {
  std::vector<size_t> width(checks_.size(), 0), ends = sections_;
  ends.push_back(checks_.size());
  size_t begin = 0;
  for (size_t end : ends) {
    size_t w = 0;
    for (size_t i = begin; i < end; ++i) w = std::max(w, checks_[i].name.size());
    for (size_t i = begin; i < end; ++i) width[i] = w;
    begin = end;
  }
  for (size_t i = 0; i < checks_.size(); ++i) {
    const Check& c = checks_[i];
    if (rank != 0 && c.status != Status::Fail) continue;
    const char* tag = c.status == Status::Pass   ? "PASS"
                      : c.status == Status::Warn ? "WARN"
                                                 : "FAIL";
    std::string line = rank == 0 ? fmt::format("{}  {:<{}}  {}", tag, c.name, width[i], c.found)
                                 : fmt::format("{}  [rank {}] {}: {}", tag, rank, c.name, c.found);
    if (!c.advice.empty()) line += " -> " + c.advice;
    out << line << '\n';
  }
  out.flush();
}

std::string gib(double bytes) {
  return fmt::format("{:.1f} GiB", bytes / kGiB);
}

std::string size_of(double bytes) {
  return bytes < kGiB ? fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0)) : gib(bytes);
}

std::string message_of(const std::exception& e) {
  std::string m = e.what();
  const size_t at = m.rfind(" [src/");
  if (at != std::string::npos && m.back() == ']') m.resize(at);
  return m;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : fallback;
}

std::optional<int64_t> env_count(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || (*end != '\0' && *end != ',') || n < 1) return -1;
  return n;
}

std::optional<std::string> first_line(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::string line;
  if (!f || !std::getline(f, line)) return std::nullopt;
  return line;
}

}  // namespace verl::cli::doctor
