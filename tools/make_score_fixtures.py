#!/usr/bin/env python3
"""Makes the reward-model fixtures of `verl score` (tests/e2e/score.sh): tiny random HF
LlamaForSequenceClassification and Qwen2ForSequenceClassification models with the demo tokenizer's
vocabulary (512 ids, so conversations render with its chat template), and their transformers fp32
scores (eager attention) of a few hundred inputs.

For each model, under OUT_DIR/<name>/:
  config.json, model.safetensors   the model as transformers saves it
  tokenizer.json, tokenizer_config.json   copied from --tokenizer (the demo tokenizer)
  inputs.jsonl    one input a line: {"tokens": [...]} or {"messages": [...]} (the demo task's
                  questions with a made-up answer as the assistant's turn)
  scores.jsonl    {"score": x} a line: the model's logits at the last token, with messages
                  rendered by tokenizer.apply_chat_template(messages, tokenize=True,
                  add_generation_prompt=False)

Run where transformers is installed (the GPU machine):
  python3 tools/make_score_fixtures.py tests/fixtures/score --tokenizer assets/demo/model
"""
import argparse
import json
import os
import random
import shutil

import torch
import transformers
from transformers import AutoModelForSequenceClassification, AutoTokenizer, LlamaConfig, Qwen2Config

from make_golden import randomize  # the golden models' weights: larger than the default init

BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-6, num_labels=1, pad_token_id=509)


def make_config(name):
    if name == "llama_rm":  # attention and MLP biases
        return LlamaConfig(**BASE, attention_bias=True, mlp_bias=True, rope_theta=10000.0)
    if name == "qwen2_rm":  # q/k/v biases (always, in Qwen2), untied
        return Qwen2Config(**BASE, tie_word_embeddings=False, rope_theta=10000.0)
    raise ValueError(name)


def make_inputs(rng, count):
    ops = [("+", lambda a, b: a + b), ("-", lambda a, b: a - b)]
    out = []
    for i in range(count):
        if i % 2 == 0:  # token ids, 1 to 120 of them
            n = rng.randint(1, 120)
            out.append({"tokens": [rng.randrange(0, 509) for _ in range(n)]})
        else:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            sym, f = rng.choice(ops)
            answer = f(a, b) + rng.choice([0, 0, 1, -3, 10])
            out.append({"messages": [{"role": "user", "content": f"What is {a} {sym} {b}?"},
                                     {"role": "assistant", "content": f"The answer is {answer}."}]})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--count", type=int, default=300)
    args = ap.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(4321)
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    for name in ["llama_rm", "qwen2_rm"]:
        cfg = make_config(name)
        model = AutoModelForSequenceClassification.from_config(cfg, attn_implementation="eager").float()
        randomize(model, gen)
        model.eval()
        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        for f in ["tokenizer.json", "tokenizer_config.json"]:
            shutil.copy(os.path.join(args.tokenizer, f), os.path.join(out, f))
        inputs = make_inputs(random.Random(name), args.count)
        scores = []
        with torch.no_grad():
            for x in inputs:
                if "tokens" in x:
                    ids = x["tokens"]
                else:
                    ids = tok.apply_chat_template(x["messages"], tokenize=True, add_generation_prompt=False)
                    if isinstance(ids, dict) or hasattr(ids, "keys"):  # a BatchEncoding in newer releases
                        ids = ids["input_ids"]
                # One unpadded sequence: the logits at its last token.
                logits = model(input_ids=torch.tensor([list(ids)])).logits
                scores.append(float(logits[0, 0]))
        with open(os.path.join(out, "inputs.jsonl"), "w") as f:
            for x in inputs:
                f.write(json.dumps(x) + "\n")
        with open(os.path.join(out, "scores.jsonl"), "w") as f:
            for s in scores:
                f.write(json.dumps({"score": s}) + "\n")
        with open(os.path.join(out, "versions.json"), "w") as f:
            json.dump({"transformers": transformers.__version__, "torch": torch.__version__}, f)
        print(name, "saved", out, "params", sum(p.numel() for p in model.parameters()),
              "scores", min(scores), max(scores))


if __name__ == "__main__":
    main()
