#!/usr/bin/env bash
# Tokenizer encode throughput: verl.cpp (bench_tokenizer) against the JavaScript reference
# (tools/tokenizer/bench_js.mjs) on the same corpus, one thread each; prints both and the ratio.
# Usage: bench/tokenizer.sh [build dir, default build] [seconds per model, default 2]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
SECONDS_PER_MODEL=${2:-2}
make -s npm-fixtures
[ -x "$BUILD/bin/bench_tokenizer" ] || cmake --build "$BUILD" --target bench_tokenizer
cpp=$("$BUILD/bin/bench_tokenizer" "$SECONDS_PER_MODEL")
js=$(node tools/tokenizer/bench_js.mjs "$SECONDS_PER_MODEL")
node -e '
const cpp = JSON.parse(process.argv[1]), js = JSON.parse(process.argv[2]);
const out = { cpp, js, ratio: {} };
for (const m of ["qwen3", "llama3"]) {
  out.ratio[m] = {
    encode: +(cpp[m].encode_mb_s / js[m].encode_mb_s).toFixed(2),
    first_pass: +(cpp[m].first_pass_mb_s / js[m].first_pass_mb_s).toFixed(2),
    tokens_agree: cpp[m].tokens_per_pass === js[m].tokens_per_pass,
  };
}
console.log(JSON.stringify(out, null, 2));
' "$cpp" "$js"
