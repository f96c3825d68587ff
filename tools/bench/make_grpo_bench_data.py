#!/usr/bin/env python3
"""Writes the data side of the GRPO benchmark workload (configs/examples/grpo_qwen2_5_0_5b_h200.yaml):
a byte-level BPE tokenizer whose vocabulary covers every id of a Qwen2.5 model (151936), so any
token a random-weight model samples decodes, and a verl-schema JSONL of prompts that template to
about 256 tokens. Standard library only, deterministic (fixed seed).

  python3 tools/bench/make_grpo_bench_data.py OUT_DIR [--rows 512] [--prompt-tokens 256]

OUT_DIR/tokenizer/ gets tokenizer.json and tokenizer_config.json (pass it to
`verl init-model --tokenizer`), OUT_DIR/train.jsonl the prompts.

The tokenizer has no merges: every byte of the text is one token (ids 0-255 in GPT-2's vocabulary
order, tools/demo/make_demo_assets.py's bytes_to_unicode), so a prompt's length in tokens is its length in bytes plus the chat template's. Ids 256 up
to V - 4 are distinct filler tokens (" v<id>") that only a model's samples produce; the last three
ids are <|endoftext|>, <|im_start|> and <|im_end|> (the EOS), as in Qwen's ChatML.
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "demo"))
from make_demo_assets import bytes_to_unicode  # noqa: E402  GPT-2's byte alphabet, in vocabulary order

VOCAB = 151936  # Qwen2.5-0.5B's config.json vocab_size
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE_TOKENS = 19  # <|im_start|> "user\n" ... <|im_end|> "\n" <|im_start|> "assistant\n"


def tokenizer_files(out):
    order = bytes_to_unicode()  # [(byte, character)], id i is order[i]
    vocab = {ch: i for i, (_, ch) in enumerate(order)}
    space = dict(order)[ord(" ")]
    for i in range(256, VOCAB - len(SPECIALS)):
        vocab[space + "v" + str(i)] = i
    added = []
    for k, s in enumerate(SPECIALS):
        added.append({"id": VOCAB - len(SPECIALS) + k, "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    template = ("{%- for message in messages %}\n"
                "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\n"
                "{%- endfor %}\n"
                "{%- if add_generation_prompt %}\n{{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n")
    cfg = {
        "add_bos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
        "chat_template": template, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
        "errors": "replace", "model_max_length": 32768, "pad_token": "<|endoftext|>",
        "tokenizer_class": "Qwen2Tokenizer",
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def prompts(path, rows, prompt_tokens, seed):
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "sum", "add", "then", "what", "is", "the", "of", "and",
             "number", "count", "apples", "total", "each", "more", "less", "many"]
    body = prompt_tokens - TEMPLATE_TOKENS
    with open(path, "w") as f:
        for i in range(rows):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            question = f"What is {a} + {b}?"
            text = question
            while len(text) < body:
                text = " ".join(rng.choice(words) for _ in range(8)) + " " + text
            text = text[len(text) - body:].lstrip()  # the question stays at the end
            row = {"data_source": "arith", "prompt": [{"role": "user", "content": text}], "ability": "math",
                   "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                   "extra_info": {"split": "train", "index": i}}
            f.write(json.dumps(row) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    tokenizer_files(os.path.join(a.out, "tokenizer"))
    prompts(os.path.join(a.out, "train.jsonl"), a.rows, a.prompt_tokens, a.seed)
    print(f"wrote {a.out}/tokenizer (vocabulary {VOCAB}) and {a.out}/train.jsonl ({a.rows} rows)")


if __name__ == "__main__":
    main()
