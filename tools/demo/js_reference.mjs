// The independent reference for tools/demo/check_demo_assets.py: loads assets/demo's tokenizer.json and
// tokenizer_config.json into @lenml/tokenizers (a fork of transformers.js) and answers JSON lines on stdin:
//   {"text": "..."}                                  -> {"ids": [...]}                 (no special tokens added)
//   {"ids": [...]}                                   -> {"text": ..., "skip": ...}     (decode; skip_special_tokens)
//   {"messages": [...], "add_generation_prompt": b}  -> {"text": ..., "ids": [...]}   (chat template, then encode)
// Run: make npm-fixtures && node tools/demo/js_reference.mjs [TOKENIZER_DIR] < requests.jsonl
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const require = createRequire(path.join(root, "tests/fixtures/npm/package.json"));
const { TokenizerLoader } = require("@lenml/tokenizers");

const dir = process.argv[2] ?? path.join(root, "assets/demo");
const read = (name) => JSON.parse(fs.readFileSync(path.join(dir, name), "utf8"));
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: read("tokenizer.json"),
  tokenizerConfig: read("tokenizer_config.json"),
});

const out = [];
for (const line of fs.readFileSync(0, "utf8").split("\n")) {
  if (line.trim().length === 0) continue;
  const req = JSON.parse(line);
  if (req.messages !== undefined) {
    const text = tok.apply_chat_template(req.messages, {
      tokenize: false,
      add_generation_prompt: req.add_generation_prompt ?? true,
    });
    out.push({ text, ids: tok.encode(text, { add_special_tokens: false }) });
  } else if (req.ids !== undefined && req.ids.length === 0) {
    out.push({ text: "", skip: "" }); // the library refuses an empty id list
  } else if (req.ids !== undefined) {
    out.push({
      text: tok.decode(req.ids, { skip_special_tokens: false }),
      skip: tok.decode(req.ids, { skip_special_tokens: true }),
    });
  } else {
    out.push({ ids: tok.encode(req.text, { add_special_tokens: false }) });
  }
}
process.stdout.write(out.map((o) => JSON.stringify(o)).join("\n") + "\n");
