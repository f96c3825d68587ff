// Encode throughput of the JavaScript reference (@lenml/tokenizers) on the same corpus and with
// the same protocol as bench/bench_tokenizer.cpp: a first pass, then repeated passes for at least
// MIN_SECONDS (argv[2], default 2). Prints JSON.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { performance } from "node:perf_hooks";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const require = createRequire(path.join(root, "tests/fixtures/npm/package.json"));
const minSeconds = Number(process.argv[2] ?? 2);

const corpus = fs
  .readFileSync(path.join(root, "tests/fixtures/tokenizer/corpus.jsonl"), "utf8")
  .split("\n")
  .filter((l) => l.length > 0)
  .map((l) => JSON.parse(l).text);
const bytes = corpus.reduce((n, t) => n + Buffer.byteLength(t, "utf8"), 0);

const out = { bench: "tokenizer_encode_js", threads: 1, corpus_lines: corpus.length, corpus_bytes: bytes };
for (const name of ["qwen3", "llama3"]) {
  const t0 = performance.now();
  const tok = require(`@lenml/tokenizer-${name}`).fromPreTrained();
  const loadS = (performance.now() - t0) / 1e3;
  let tokens = 0;
  const pass = () => {
    for (const text of corpus) tokens += tok.encode(text, { add_special_tokens: false }).length;
  };
  const t1 = performance.now();
  pass();
  const firstS = (performance.now() - t1) / 1e3;
  const tokensPerPass = tokens;
  let passes = 0;
  const t2 = performance.now();
  let steadyS = 0;
  while (steadyS < minSeconds) {
    pass();
    passes++;
    steadyS = (performance.now() - t2) / 1e3;
  }
  out[name] = {
    load_s: loadS,
    tokens_per_pass: tokensPerPass,
    first_pass_mb_s: bytes / firstS / 1e6,
    encode_mb_s: (bytes * passes) / steadyS / 1e6,
    passes,
  };
}
console.log(JSON.stringify(out, null, 2));
