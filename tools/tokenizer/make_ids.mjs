// Writes the reference ids for tests/fixtures/tokenizer/corpus.jsonl, made by the independent
// JavaScript implementation (@lenml/tokenizers, a fork of transformers.js), for Qwen3 and Llama-3:
// tests/fixtures/tokenizer/ids_<name>.jsonl, one {"ids": [...], "skip": "..."} per corpus line, where
// "skip" is decode(ids, skip_special_tokens=true) with the config's clean_up_tokenization_spaces.
// Run: make npm-fixtures && node tools/tokenizer/make_ids.mjs
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const require = createRequire(path.join(root, "tests/fixtures/npm/package.json"));
const fixtures = path.join(root, "tests/fixtures/tokenizer");

const corpus = fs
  .readFileSync(path.join(fixtures, "corpus.jsonl"), "utf8")
  .split("\n")
  .filter((l) => l.length > 0)
  .map((l) => JSON.parse(l).text);

for (const name of ["qwen3", "llama3"]) {
  const tok = require(`@lenml/tokenizer-${name}`).fromPreTrained();
  const out = corpus.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false });
    const skip = tok.decode(ids, { skip_special_tokens: true });
    return JSON.stringify({ ids, skip });
  });
  const file = path.join(fixtures, `ids_${name}.jsonl`);
  fs.writeFileSync(file, out.join("\n") + "\n");
  console.error(`wrote ${out.length} lines to ${path.relative(root, file)}`);
}
