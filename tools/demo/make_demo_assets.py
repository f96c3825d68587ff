#!/usr/bin/env python3
"""Writes the bundled demo task and tokenizer: assets/demo/.

  tokenizer.json, tokenizer_config.json, vocab.json, merges.txt
      A Hugging Face byte-level BPE tokenizer in Qwen2's format (NFC normalizer, Qwen2's Split regex,
      which cuts numbers into single digits, then ByteLevel; ByteLevel decoder). The vocabulary is the
      256 byte tokens in GPT-2's byte-to-unicode order, then the merges learned here by a plain greedy
      BPE on the rendered task corpus, then <|endoftext|>, <|im_start|>, <|im_end|>.
  sft.jsonl      {"messages": [user, assistant]} rows for the SFT trainer.
  train.jsonl    verl RL rows (data_source "arith") for GRPO.
  val.jsonl      verl RL rows for validation; their problems appear neither in train.jsonl nor (for the
                 operators in SFT_HOLDOUT_OPS) in sft.jsonl.

The "arith" task: "What is 47 + 38?" -> "47 + 38 = 85. #### 85" (rewarded) or
"47 + 38 = 85. The answer is 85." (correct but unrewarded). Only REWARDED_SHARE of the SFT responses use
the rewarded format, so the SFT model mostly answers in the other one and GRPO has a format to learn.
See assets/demo/README.md.

Deterministic (fixed seed), standard library only. Run from anywhere:
    python3 tools/demo/make_demo_assets.py [--out assets/demo]
"""
import argparse
import json
import os
import random
import re
import sys
from collections import Counter

# ---------------------------------------------------------------------------------------------------
# Task parameters (change here).
SEED = 20240607
N_SFT = 20000
N_TRAIN = 2000
N_VAL = 128
REWARDED_SHARE = 0.35  # share of SFT responses that end with "#### <answer>"

# operator -> (weight, range of a, range of b, extra constraint); ranges are inclusive.
OPERATORS = {
    "+": dict(weight=0.4, a=(10, 99), b=(10, 99), ok=lambda a, b: True, fn=lambda a, b: a + b),
    "-": dict(weight=0.4, a=(10, 99), b=(10, 99), ok=lambda a, b: b <= a, fn=lambda a, b: a - b),
    "*": dict(weight=0.2, a=(2, 9), b=(2, 9), ok=lambda a, b: True, fn=lambda a, b: a * b),
}
# Val problems of these operators are kept out of sft.jsonl too (a 2-digit sum can be generalised;
# the 64 one-digit products are facts, so the SFT data shows all of them).
SFT_HOLDOUT_OPS = ("+", "-")

PROMPTS = [
    "What is {a} {op} {b}?",
    "Compute {a} {op} {b}.",
    "Calculate {a} {op} {b}.",
    "How much is {a} {op} {b}?",
]
WORKED = "{a} {op} {b} = {c}."
REWARDED = "{worked} #### {c}"          # what the arith scorer rewards: the last "#### n" equals the truth
UNREWARDED = "{worked} The answer is {c}."  # correct, but the scorer finds no "####": reward 0

# Tokenizer parameters.
MAX_MERGES = 253  # 256 bytes + 253 merges + 3 special tokens = 512 ids at most
MIN_PAIR_COUNT = 2  # stop merging when the best pair occurs fewer times than this
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS, PAD = "<|im_end|>", "<|endoftext|>"
SYSTEM_PROMPT = "You are a helpful assistant."  # optional; used only as extra tokenizer-training text
# General text added to the tokenizer's training corpus (each line counted MIN_PAIR_COUNT times), so that
# an instruction or a system message a user adds is not spelled out byte by byte. verl's GSM8K
# instruction is among them.
EXTRA_TEXT = [
    SYSTEM_PROMPT,
    "Let's think step by step and output the final answer after \"####\".",
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "Add the numbers, subtract the second number from the first, or multiply them.",
    "The sum of two numbers is their total; the difference is what remains; the product is the result of multiplication.",
    "Show your work on one line, then write the final answer after four hash marks.",
    "This is a small arithmetic task for a tiny language model trained with reinforcement learning.",
    "The reward is one when the response ends with the correct answer in the requested format, and zero otherwise.",
    "Check the result carefully before you answer the question.",
    "If you are not sure, explain what you know and give your best guess.",
]
CHAT_TEMPLATE = (
    "{%- for message in messages %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)
# Qwen2's pre-tokenizer regex (tokenizer.json) and its ASCII equivalent for Python's `re`, which has no
# \p{..}; the corpus is checked to be ASCII, where \p{L} = [A-Za-z] and \p{N} = [0-9].
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
ASCII_REGEX = re.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]"
    r"| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


# ---------------------------------------------------------------------------------------------------
# Tokenizer: byte-level alphabet, BPE training and encoding.
def bytes_to_unicode():
    """GPT-2's map from bytes to printable characters, in GPT-2's (and Qwen2's) vocabulary order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return list(zip(bs, [chr(c) for c in cs]))


BYTE_ORDER = bytes_to_unicode()
BYTE_ENC = dict(BYTE_ORDER)
SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")


def pretokenize(text):
    """Text without special tokens -> byte-level words (strings over the byte alphabet)."""
    if not text.isascii():
        raise ValueError(f"pretokenize: the ASCII regex cannot split non-ASCII text: {text!r}")
    return ["".join(BYTE_ENC[b] for b in m.group(0).encode("utf-8")) for m in ASCII_REGEX.finditer(text)]


def train_bpe(texts):
    """Greedy BPE: repeatedly merge the most frequent adjacent pair (ties: the smaller pair)."""
    words = Counter()
    for text in texts:
        for part in SPECIAL_SPLIT.split(text):
            if part and part not in SPECIAL_TOKENS:
                words.update(pretokenize(part))
    seqs = [(list(w), n) for w, n in sorted(words.items())]
    vocab = [c for _, c in BYTE_ORDER]
    known = set(vocab)
    merges = []
    while len(merges) < MAX_MERGES:
        pairs = Counter()
        for seq, n in seqs:
            for i in range(len(seq) - 1):
                pairs[(seq[i], seq[i + 1])] += n
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if best[1] < MIN_PAIR_COUNT:
            break
        (x, y), _ = best
        merges.append((x, y))
        if x + y not in known:  # a token made twice keeps its first id (as the HF trainer does)
            known.add(x + y)
            vocab.append(x + y)
        for seq, _ in seqs:
            i = 0
            while i < len(seq) - 1:
                if seq[i] == x and seq[i + 1] == y:
                    seq[i:i + 2] = [x + y]
                i += 1
    return vocab, merges


class Encoder:
    """HF's BPE on our files: special tokens split out, NFC (a no-op on ASCII), regex, byte level,
    then the lowest-ranked merge first. Used for the length checks here; the check script compares it
    with the C++ and JavaScript tokenizers."""

    def __init__(self, vocab, merges):
        self.ids = {t: i for i, t in enumerate(vocab)}
        for k, t in enumerate(SPECIAL_TOKENS):
            self.ids[t] = len(vocab) + k
        self.merges = list(merges)
        self.ranks = {m: r for r, m in enumerate(merges)}
        self.cache = {}

    def bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            ranked = [(self.ranks.get((parts[i], parts[i + 1]), 1 << 30), i) for i in range(len(parts) - 1)]
            rank, _ = min(ranked)
            if rank == 1 << 30:
                break
            pair = self.merges[rank]
            out, i = [], 0
            while i < len(parts):
                if i < len(parts) - 1 and (parts[i], parts[i + 1]) == pair:
                    out.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            parts = out
        return parts

    def encode(self, text):
        ids = []
        for part in SPECIAL_SPLIT.split(text):
            if not part:
                continue
            if part in SPECIAL_TOKENS:
                ids.append(self.ids[part])
                continue
            for w in pretokenize(part):
                if w not in self.cache:
                    self.cache[w] = [self.ids[t] for t in self.bpe(w)]
                ids.extend(self.cache[w])
        return ids


def render_chat(messages, add_generation_prompt):
    """What CHAT_TEMPLATE renders (checked against the C++ and JS Jinja engines by the check script)."""
    s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return s + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def tokenizer_files(vocab, merges):
    n = len(vocab)
    added = [dict(id=n + k, content=t, single_word=False, lstrip=False, rstrip=False, normalized=False,
                  special=True) for k, t in enumerate(SPECIAL_TOKENS)]
    byte_level = dict(type="ByteLevel", add_prefix_space=False, trim_offsets=False, use_regex=False)
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
            byte_level,
        ]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(vocab)},
            "merges": [f"{x} {y}" for x, y in merges],
        },
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(a["id"]): {k: a[k] for k in
                                 ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
                                 for a in added},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "errors": "replace",
        "model_max_length": 512,
        "pad_token": PAD,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    return tokenizer, config


# ---------------------------------------------------------------------------------------------------
# Task data.
def problem_pool(op):
    spec = OPERATORS[op]
    (a0, a1), (b0, b1) = spec["a"], spec["b"]
    return [(op, a, b) for a in range(a0, a1 + 1) for b in range(b0, b1 + 1) if spec["ok"](a, b)]


def answer(problem):
    op, a, b = problem
    return OPERATORS[op]["fn"](a, b)


class Drawer:
    """Draws problems of one operator without replacement, reshuffling when the pool runs out."""

    def __init__(self, pool, rng):
        self.pool, self.rng, self.left = list(pool), rng, []

    def draw(self):
        if not self.left:
            self.left = self.pool[:]
            self.rng.shuffle(self.left)
        return self.left.pop()


def draw_problems(n, pools, rng):
    ops = list(OPERATORS)
    weights = [OPERATORS[o]["weight"] for o in ops]
    drawers = {o: Drawer(pools[o], rng) for o in ops}
    return [drawers[rng.choices(ops, weights)[0]].draw() for _ in range(n)]


def prompt_text(problem, rng):
    op, a, b = problem
    return rng.choice(PROMPTS).format(a=a, op=op, b=b)


def response_text(problem, rewarded):
    op, a, b = problem
    c = answer(problem)
    worked = WORKED.format(a=a, op=op, b=b, c=c)
    return (REWARDED if rewarded else UNREWARDED).format(worked=worked, c=c)


def rl_row(problem, prompt, split, index):
    return {
        "data_source": "arith",
        "prompt": [{"role": "user", "content": prompt}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer(problem))},
        "extra_info": {"split": split, "index": index},
    }


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--out", default=os.path.join(root, "assets", "demo"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(SEED)

    pools = {op: problem_pool(op) for op in OPERATORS}
    val_problems = draw_problems(N_VAL, pools, rng)
    held = set(val_problems)
    train_pools = {op: [p for p in pools[op] if p not in held] for op in OPERATORS}
    sft_pools = {op: [p for p in pools[op] if op not in SFT_HOLDOUT_OPS or p not in held] for op in OPERATORS}
    for op in OPERATORS:
        if not train_pools[op] or not sft_pools[op]:
            sys.exit(f"operator {op}: every problem is held out for validation; widen its ranges")
    train_problems = draw_problems(N_TRAIN, train_pools, rng)
    sft_problems = draw_problems(N_SFT, sft_pools, rng)

    val = [rl_row(p, prompt_text(p, rng), "val", i) for i, p in enumerate(val_problems)]
    train = [rl_row(p, prompt_text(p, rng), "train", i) for i, p in enumerate(train_problems)]
    n_rewarded = round(REWARDED_SHARE * N_SFT)
    rewarded = [True] * n_rewarded + [False] * (N_SFT - n_rewarded)
    rng.shuffle(rewarded)
    sft = [{"messages": [{"role": "user", "content": prompt_text(p, rng)},
                         {"role": "assistant", "content": response_text(p, r)}]}
           for p, r in zip(sft_problems, rewarded)]

    # Tokenizer, trained on what the model will see: rendered SFT conversations and RL prompts, plus a
    # system prompt so that an optional system message does not fall apart into bytes.
    corpus = [render_chat(r["messages"], False) for r in sft]
    corpus += [render_chat(r["prompt"], True) for r in train]
    corpus += [render_chat([{"role": "system", "content": t}], False) for t in EXTRA_TEXT] * MIN_PAIR_COUNT
    vocab, merges = train_bpe(corpus)
    tokenizer, config = tokenizer_files(vocab, merges)
    enc = Encoder(vocab, merges)

    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    # The files the slow Qwen2Tokenizer reads (tokenizer.json alone serves the fast one).
    with open(os.path.join(args.out, "vocab.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump({t: i for i, t in enumerate(vocab)}, f, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(args.out, "merges.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write("#version: 0.2\n")
        f.writelines(f"{x} {y}\n" for x, y in merges)
    write_jsonl(os.path.join(args.out, "sft.jsonl"), sft)
    write_jsonl(os.path.join(args.out, "train.jsonl"), train)
    write_jsonl(os.path.join(args.out, "val.jsonl"), val)

    prompt_len = [len(enc.encode(render_chat(r["prompt"], True))) for r in train + val]
    resp_len = [len(enc.encode(r["messages"][1]["content"])) for r in sft]
    sft_len = [len(enc.encode(render_chat(r["messages"], False))) for r in sft]
    print(f"wrote {args.out}: vocab {len(vocab)} + {len(SPECIAL_TOKENS)} special = "
          f"{len(vocab) + len(SPECIAL_TOKENS)} ids ({len(merges)} merges); "
          f"sft {len(sft)} rows ({n_rewarded} rewarded format), train {len(train)}, val {len(val)}; "
          f"rendered prompt tokens max {max(prompt_len)}, response tokens max {max(resp_len)} "
          f"(+1 for <|im_end|>), SFT conversation tokens max {max(sft_len)}")


if __name__ == "__main__":
    main()
