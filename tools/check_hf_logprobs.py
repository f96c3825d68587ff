#!/usr/bin/env python3
"""Compares `verl logprobs` output with HF transformers on the same model directory and tokens.

  python3 tools/check_hf_logprobs.py MODEL_DIR INPUTS.jsonl OURS.jsonl [--texts TEXTS.jsonl IDS.jsonl]

INPUTS.jsonl holds {"tokens": [...]} lines, OURS.jsonl what `verl logprobs --model MODEL_DIR` printed
for them. Prints the largest absolute difference of log-probs and entropies (fp32, eager attention)
and exits 1 above 1e-4. With --texts, also checks that the model directory's tokenizer, loaded by
transformers' AutoTokenizer, encodes each {"text": ...} line to the ids `verl tokenize` printed.
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    model_dir, inputs, ours = sys.argv[1:4]
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).eval()
    worst_lp = worst_ent = 0.0
    n = 0
    with torch.no_grad():
        for a, b in zip(open(inputs), open(ours)):
            toks = json.loads(a)["tokens"]
            o = json.loads(b)
            if len(toks) < 2:
                continue
            logp = torch.log_softmax(model(input_ids=torch.tensor([toks])).logits[0, :-1].float(), -1)
            lp = logp.gather(-1, torch.tensor(toks[1:])[:, None])[:, 0]
            ent = -(logp.exp() * logp).sum(-1)
            worst_lp = max(worst_lp, (lp - torch.tensor(o["logprobs"])).abs().max().item())
            worst_ent = max(worst_ent, (ent - torch.tensor(o["entropy"])).abs().max().item())
            n += 1
    res = {"model": model_dir, "sequences": n, "max_abs_logprob_diff": worst_lp, "max_abs_entropy_diff": worst_ent}
    ok = worst_lp <= 1e-4 and worst_ent <= 1e-4 and n > 0
    if "--texts" in sys.argv:
        i = sys.argv.index("--texts")
        tok = AutoTokenizer.from_pretrained(model_dir)
        mism = total = 0
        for t, ids in zip(open(sys.argv[i + 1]), open(sys.argv[i + 2])):
            total += 1
            if tok.encode(json.loads(t)["text"], add_special_tokens=False) != json.loads(ids)["ids"]:
                mism += 1
        res.update({"tokenizer_lines": total, "tokenizer_mismatches": mism})
        ok = ok and mism == 0 and total > 0
    print(json.dumps(res))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
