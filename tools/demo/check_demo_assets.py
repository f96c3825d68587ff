#!/usr/bin/env python3
"""Checks assets/demo (made by tools/demo/make_demo_assets.py).

1. Tokenizer: on a seeded sample of 500 task strings (user prompts, assistant responses, SFT
   conversations and RL prompts rendered by the chat template, some with a system message) plus a few
   edge cases, our C++ tokenizer (`verl tokenize`), the JavaScript reference (@lenml/tokenizers, via
   tools/demo/js_reference.mjs) and the generator's own Python BPE give identical ids; both engines
   render the same chat text as the generator's ChatML (and jinja2, when it is installed); decode round-trips (with and without special
   tokens); every digit is a token of its own.
2. Lengths over all rows (C++ tokenizer): rendered RL prompt tokens, SFT response tokens, SFT
   conversation tokens.
3. Data: verl's RL schema, ground truths equal the arithmetic, val problems kept out of train (and
   out of SFT for the held-out operators), the share of SFT responses in the rewarded format, and the
   built-in "arith" scorer (`verl reward`) giving 1 to exactly those and 0 to the others.
4. Size of assets/demo (without model/) under 5 MB.

Run: make npm-fixtures && python3 tools/demo/check_demo_assets.py [--verl build/bin/verl] [--dir assets/demo]
Exit status 0 when everything holds; each failure is printed.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import make_demo_assets as gen  # noqa: E402

FAILURES = []


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        print("FAIL:", msg)
    return cond


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_lines(cmd, rows):
    """Feeds JSON lines to a command, returns its JSON lines (one per input)."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", encoding="utf-8", delete=False) as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        name = f.name
    try:
        with open(name, "rb") as inp:
            p = subprocess.run(cmd, stdin=inp, capture_output=True)
    finally:
        os.unlink(name)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr.decode(errors='replace')[-2000:]}")
    out = [json.loads(line) for line in p.stdout.decode("utf-8").splitlines() if line.strip()]
    if len(out) != len(rows):
        sys.exit(f"{' '.join(cmd)}: {len(rows)} lines in, {len(out)} out")
    return out


EDGE_CASES = [
    "What is 100 + 250?", "Compute 12345 * 6789.", "-17 + -4 = -21. #### -21", "#### 1,234,567",
    "####85", "The answer is 0.", "  two  spaces  and a tab\there\n\nnew lines\r\n",
    "inline <|im_start|>user\nhi<|im_end|>\n and <|endoftext|> tokens", "<|im_end|>",
    "Let's think step by step and output the final answer after \"####\".",
    "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \U0001F600\U0001F44D\U0001F3FD",
    "\u0663\u0664 + \u0665 (Arabic-Indic digits), \u00bd and \u2163", "I'll, you're, we've, it's, they'd",
    "", " ", "\n", "9" * 40,
]


def is_digit_token(tok_bytes):
    return len(tok_bytes) == 1 and 0x30 <= tok_bytes[0] <= 0x39


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--verl", default=os.environ.get("VERL", os.path.join(ROOT, "build", "bin", "verl")))
    ap.add_argument("--dir", default=os.path.join(ROOT, "assets", "demo"))
    ap.add_argument("--sample", type=int, default=500)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    d = args.dir
    verl_tok = [args.verl, "tokenize", "--tokenizer", d]
    js = ["node", os.path.join(HERE, "js_reference.mjs"), d]
    if not os.path.isdir(os.path.join(ROOT, "tests/fixtures/npm/node_modules/@lenml/tokenizers")):
        sys.exit("the JavaScript reference is missing: run `make npm-fixtures` in the repository root")

    sft = read_jsonl(os.path.join(d, "sft.jsonl"))
    train = read_jsonl(os.path.join(d, "train.jsonl"))
    val = read_jsonl(os.path.join(d, "val.jsonl"))
    with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
        tc = json.load(f)

    # ---- tokenizer files
    vocab = tj["model"]["vocab"]
    merges = [tuple(m.split(" ")) for m in tj["model"]["merges"]]
    byte_dec = {c: b for b, c in gen.BYTE_ORDER}
    check(sorted(vocab.values()) == list(range(len(vocab))), "vocab ids are not 0..n-1")
    check([t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])][:256] == [c for _, c in gen.BYTE_ORDER],
          "the first 256 ids are not the byte alphabet in GPT-2 order")
    check(all(x in vocab and y in vocab and x + y in vocab for x, y in merges), "a merge uses a token not in vocab")
    added = {a["content"]: a["id"] for a in tj["added_tokens"]}
    check(list(added) == gen.SPECIAL_TOKENS and list(added.values()) == list(range(len(vocab), len(vocab) + 3)),
          f"added tokens {added}")
    check(all(a["special"] for a in tj["added_tokens"]), "added tokens not special")
    check(tc["eos_token"] == "<|im_end|>" and tc["pad_token"] == "<|endoftext|>", "eos/pad tokens")
    check({v["content"] for v in tc["added_tokens_decoder"].values()} == set(gen.SPECIAL_TOKENS),
          "added_tokens_decoder")
    digit_tokens = {}
    for t, i in vocab.items():
        tb = bytes(byte_dec[c] for c in t)
        if any(0x30 <= b <= 0x39 for b in tb):
            check(is_digit_token(tb), f"token {t!r} ({i}) holds a digit and something else")
        if is_digit_token(tb):
            digit_tokens[i] = tb.decode()
    check(len(digit_tokens) == 10, "not every digit 0-9 has its own token")
    n_ids = len(vocab) + len(added)
    print(f"tokenizer: {len(vocab)} byte/merge tokens ({len(merges)} merges) + {len(added)} special = {n_ids} ids; "
          f"eos {tc['eos_token']} = {added['<|im_end|>']}, pad {tc['pad_token']} = {added['<|endoftext|>']}")

    # ---- the sample
    rng = random.Random(7)
    q = args.sample // 4
    user_prompts = [r["messages"][0]["content"] for r in rng.sample(sft, q // 2)] + \
        [r["prompt"][0]["content"] for r in rng.sample(train + val, q - q // 2)]
    responses = [r["messages"][1]["content"] for r in rng.sample(sft, q)]
    convs = [{"messages": r["messages"], "add_generation_prompt": False} for r in rng.sample(sft, q)]
    rl = []
    for k, r in enumerate(rng.sample(train + val, args.sample - 3 * q)):
        msgs = r["prompt"]
        if k % 4 == 0:
            msgs = [{"role": "system", "content": rng.choice(gen.EXTRA_TEXT)}] + msgs
        rl.append({"messages": msgs, "add_generation_prompt": True})
    chats = convs + rl
    texts = user_prompts + responses
    print(f"sample: {len(user_prompts)} prompts, {len(responses)} responses, {len(convs)} SFT conversations, "
          f"{len(rl)} RL prompts with generation prompt ({(len(rl) + 3) // 4} with a system message) = "
          f"{len(texts) + len(chats)} task strings, plus {len(EDGE_CASES)} edge cases")

    # chat rendering: C++ and JS engines against the generator's ChatML
    cpp_chat = run_lines(verl_tok + ["--chat"], chats)
    js_chat = run_lines(js, chats)
    bad = 0
    for c, a, b in zip(chats, cpp_chat, js_chat):
        want = gen.render_chat(c["messages"], c["add_generation_prompt"])
        if not (a["text"] == b["text"] == want and a["ids"] == b["ids"]):
            bad += 1
            if bad <= 3:
                print("  chat mismatch:", json.dumps(c), json.dumps(a), json.dumps(b))
    check(bad == 0, f"chat template: {bad}/{len(chats)} conversations differ (text or ids) between C++, JS, ChatML")
    try:  # optional third engine: jinja2 configured as transformers configures it
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        tmpl = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(tc["chat_template"])
        bad = sum(1 for c in chats if tmpl.render(messages=c["messages"], add_generation_prompt=c["add_generation_prompt"])
                  != gen.render_chat(c["messages"], c["add_generation_prompt"]))
        check(bad == 0, f"chat template: jinja2 renders {bad}/{len(chats)} conversations differently")
        print(f"jinja2: renders the {len(chats)} conversations as ChatML too")
    except ImportError:
        print("jinja2: not installed, skipped (optional)")

    # encode: C++ vs JS vs Python on the texts, the rendered chats and the edge cases
    all_texts = texts + [gen.render_chat(c["messages"], c["add_generation_prompt"]) for c in chats] + EDGE_CASES
    cpp = run_lines(verl_tok, [{"text": t} for t in all_texts])
    jsr = run_lines(js, [{"text": t} for t in all_texts])
    enc = gen.Encoder([t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])], merges)
    bad = bad_py = bad_digit = 0
    for t, a, b in zip(all_texts, cpp, jsr):
        if a["ids"] != b["ids"]:
            bad += 1
            if bad <= 3:
                print("  encode mismatch:", json.dumps(t), a["ids"], b["ids"])
        if t.isascii() and enc.encode(t) != a["ids"]:
            bad_py += 1
            if bad_py <= 3:
                print("  python encoder mismatch:", json.dumps(t), enc.encode(t), a["ids"])
        if sum(1 for i in a["ids"] if i in digit_tokens) != sum(1 for ch in t if "0" <= ch <= "9"):
            bad_digit += 1
    check(bad == 0, f"encode: {bad}/{len(all_texts)} strings differ between C++ and JS")
    check(bad_py == 0, f"encode: {bad_py} ASCII strings differ between C++ and the generator's Python BPE")
    check(bad_digit == 0, f"digits: {bad_digit} strings where digits are not one token each")

    # decode round trips (all texts are NFC, so decode(encode(t)) == t)
    ids_rows = [{"ids": a["ids"]} for a in cpp]
    cpp_dec = run_lines(verl_tok + ["--decode"], ids_rows)
    cpp_skip = run_lines(verl_tok + ["--decode", "--skip-special-tokens"], ids_rows)
    js_dec = run_lines(js, ids_rows)
    bad = bad_skip = 0
    for t, a, s, b in zip(all_texts, cpp_dec, cpp_skip, js_dec):
        if not (a["text"] == b["text"] == t):
            bad += 1
            if bad <= 3:
                print("  decode mismatch:", json.dumps(t), json.dumps(a["text"]), json.dumps(b["text"]))
        if not (s["text"] == b["skip"] == gen.SPECIAL_SPLIT.sub("", t)):
            bad_skip += 1
            if bad_skip <= 3:
                print("  skip-special decode mismatch:", json.dumps(t), json.dumps(s["text"]), json.dumps(b["skip"]))
    check(bad == 0, f"decode: {bad}/{len(all_texts)} do not round-trip in C++ and JS")
    check(bad_skip == 0, f"decode with skip_special_tokens: {bad_skip}/{len(all_texts)} differ")
    print(f"tokenizer checks on {len(all_texts)} strings ({len(chats)} rendered by both chat engines): "
          f"{'ok' if not FAILURES else 'FAILED'}")

    # ---- lengths over all rows (C++ tokenizer)
    prompt_ids = run_lines(verl_tok + ["--chat"], [{"messages": r["prompt"], "add_generation_prompt": True}
                                                   for r in train + val])
    resp_ids = run_lines(verl_tok, [{"text": r["messages"][1]["content"]} for r in sft])
    conv_ids = run_lines(verl_tok + ["--chat"], [{"messages": r["messages"], "add_generation_prompt": False}
                                                 for r in sft])
    pl = [len(x["ids"]) for x in prompt_ids]
    rlen = [len(x["ids"]) for x in resp_ids]
    cl = [len(x["ids"]) for x in conv_ids]
    print(f"lengths: rendered RL prompt tokens max {max(pl)} mean {sum(pl) / len(pl):.1f}; SFT response tokens "
          f"max {max(rlen)} mean {sum(rlen) / len(rlen):.1f} (+1 for <|im_end|>); SFT conversation tokens max "
          f"{max(cl)} mean {sum(cl) / len(cl):.1f}; SFT tokens total {sum(cl)}")
    check(max(rlen) + 1 <= 24, f"a response is longer than 24 tokens with <|im_end|> ({max(rlen) + 1})")

    # ---- data
    pat = re.compile(r"(\d+) ([-+*]) (\d+)")

    def problem_of(text):
        m = pat.search(text)
        return (m.group(2), int(m.group(1)), int(m.group(3))) if m else None

    keys = ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    for split, rows in (("train", train), ("val", val)):
        for i, r in enumerate(rows):
            ok = (list(r) == keys and r["data_source"] == "arith" and r["ability"] == "math"
                  and len(r["prompt"]) == 1 and r["prompt"][0]["role"] == "user"
                  and r["reward_model"]["style"] == "rule" and r["extra_info"] == {"split": split, "index": i})
            p = problem_of(r["prompt"][0]["content"])
            ok = ok and p is not None and r["reward_model"]["ground_truth"] == str(gen.answer(p))
            if not check(ok, f"{split}.jsonl row {i}: schema or ground truth wrong: {json.dumps(r)}"):
                break
    val_probs = {problem_of(r["prompt"][0]["content"]) for r in val}
    train_probs = {problem_of(r["prompt"][0]["content"]) for r in train}
    sft_probs = {problem_of(r["messages"][0]["content"]) for r in sft}
    check(not (val_probs & train_probs), f"{len(val_probs & train_probs)} val problems also in train")
    leaked = {p for p in val_probs & sft_probs if p[0] in gen.SFT_HOLDOUT_OPS}
    check(not leaked, f"{len(leaked)} held-out val problems in sft")
    check(not ({r["prompt"][0]["content"] for r in val} & {r["prompt"][0]["content"] for r in train}),
          "a val prompt string is also a train prompt")

    gsm8k = re.compile(r"#### (\-?[0-9\.\,]+)")  # verl's gsm8k "strict" pattern, which arith uses
    rewarded = 0
    for i, r in enumerate(sft):
        m = r["messages"]
        p = problem_of(m[0]["content"])
        ok = len(m) == 2 and m[0]["role"] == "user" and m[1]["role"] == "assistant" and p is not None
        c = str(gen.answer(p)) if p else None
        ok = ok and m[1]["content"].startswith(f"{p[1]} {p[0]} {p[2]} = {c}.")
        found = gsm8k.findall(m[1]["content"]) if ok else []
        if found:
            ok = ok and found[-1] == c and m[1]["content"].endswith("#### " + c)
            rewarded += 1
        else:
            ok = ok and m[1]["content"].endswith(f" {c}.")
        if not check(ok, f"sft.jsonl row {i}: malformed: {json.dumps(r)}"):
            break
    share = rewarded / len(sft)
    check(abs(share - gen.REWARDED_SHARE) < 0.01, f"rewarded share {share:.3f} != {gen.REWARDED_SHARE}")
    ops = dict(sorted(Counter(problem_of(r["prompt"][0]["content"])[0] for r in train).items()))
    print(f"data: sft {len(sft)} rows ({share:.1%} rewarded format, {len(sft_probs)} distinct problems), "
          f"train {len(train)} ({len(train_probs)} distinct problems; ops {ops}), val {len(val)} "
          f"({len(val_probs)} distinct, disjoint from train; +/- ones absent from sft)")

    # the C++ arith scorer on every SFT response: 1 for the rewarded format, 0 for the other
    scored = run_lines([args.verl, "reward"], [
        {"data_source": "arith", "solution_str": r["messages"][1]["content"],
         "ground_truth": str(gen.answer(problem_of(r["messages"][0]["content"])))} for r in sft])
    want = [1.0 if "####" in r["messages"][1]["content"] else 0.0 for r in sft]
    bad = sum(1 for s, w in zip(scored, want) if s["score"] != w)
    check(bad == 0, f"verl reward (arith): {bad}/{len(sft)} SFT responses scored unexpectedly")
    print(f"scorer: verl reward gives mean {sum(s['score'] for s in scored) / len(scored):.3f} on the SFT "
          f"responses (1 exactly on the '####' ones: {'yes' if bad == 0 else 'NO'})")

    # ---- size
    total = 0
    for dirpath, dirnames, filenames in os.walk(d):
        if os.path.relpath(dirpath, d).split(os.sep)[0] == "model":
            continue
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in filenames)
    check(total < 5 * 1024 * 1024, f"assets/demo is {total} bytes (> 5 MB)")
    print(f"size: {total / 1e6:.2f} MB (without model/)")

    if FAILURES:
        print(f"{len(FAILURES)} check(s) FAILED")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
