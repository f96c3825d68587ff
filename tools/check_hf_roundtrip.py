#!/usr/bin/env python3
"""Checks that models saved by verl load in HF transformers with the same numbers.

For each golden model G (tests/fixtures/golden/G) and its copy written by `verl convert` (DIR/G_f32,
optionally DIR/G_bf16), on the machine where transformers is installed:
  * the f32 copy's state_dict equals the original's bit for bit, and so do the logits;
  * for causal LMs, transformers' log-probs of the copy equal what `verl logprobs` printed for it
    (DIR/G_{f32,bf16}_ours.jsonl, made with DIR/G_inputs.jsonl).
Usage: python3 tools/check_hf_roundtrip.py DIR   (prints one JSON line per check; exit 1 on failure)
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoModelForTokenClassification

GOLDEN = "tests/fixtures/golden"
KINDS = {"qwen2": AutoModelForCausalLM, "llama3": AutoModelForCausalLM, "qwen3": AutoModelForCausalLM,
         "qwen2_critic": AutoModelForTokenClassification, "llama_rm": AutoModelForSequenceClassification}


def load(cls, path):
    return cls.from_pretrained(path, attn_implementation="eager", dtype=torch.float32).eval()


def main():
    root = sys.argv[1]
    ok = True
    for name, cls in KINDS.items():
        orig = load(cls, os.path.join(GOLDEN, name))
        seqs = json.load(open(os.path.join(GOLDEN, name, "inputs.json")))["sequences"]
        for variant in ["f32", "bf16"]:
            path = os.path.join(root, f"{name}_{variant}")
            if not os.path.isdir(path):
                continue
            copy = load(cls, path)
            res = {"model": name, "variant": variant}
            if variant == "f32":
                a, b = orig.state_dict(), copy.state_dict()
                res["same_keys"] = sorted(a) == sorted(b)
                res["tensors_bitwise_equal"] = res["same_keys"] and all(torch.equal(a[k], b[k]) for k in a)
                with torch.no_grad():
                    diff = max((orig(input_ids=torch.tensor([s])).logits -
                                copy(input_ids=torch.tensor([s])).logits).abs().max().item() for s in seqs)
                res["max_abs_logit_diff_vs_original"] = diff
                ok &= res["tensors_bitwise_equal"] and diff == 0.0
            ours_path = os.path.join(root, f"{name}_{variant}_ours.jsonl")
            if os.path.exists(ours_path):
                ours = [json.loads(l) for l in open(ours_path)]
                worst = 0.0
                with torch.no_grad():
                    for s, o in zip(seqs, ours):
                        if len(s) < 2:
                            continue
                        logp = torch.log_softmax(copy(input_ids=torch.tensor([s])).logits[0, :-1], -1)
                        lp = logp.gather(-1, torch.tensor(s[1:])[:, None])[:, 0]
                        worst = max(worst, (lp - torch.tensor(o["logprobs"])).abs().max().item())
                res["max_abs_logprob_diff_ours_vs_transformers"] = worst
                ok &= worst <= 1e-4
            print(json.dumps(res))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
