#!/usr/bin/env python3
"""Makes the golden fixtures that pin our CPU model to HF transformers (fp32, eager attention).

For tiny random models of each supported family/head it writes, under tests/fixtures/golden/<name>/:
  config.json, model.safetensors   the model as transformers saves it
  golden.safetensors               reference outputs for the sequences in inputs.json:
    logprob.<s>, entropy.<s>       log p(x[i+1] | x[:i+1]) and entropy at i < n-1 (temperature 1)
    logprob_t07.<s>                the same at temperature 0.7
    grad.<hf name>                 d(sum of all log-probs)/d(param)          (causal LM)
    values.<s> / score.<s>         critic values per token / reward score    (classification heads)
    grad.<hf name>                 d(sum of values or scores)/d(param)       (classification heads)
  inputs.json                      {"sequences": [[ids...], ...]}
Run where transformers is installed (the GPU machine):  python3 tools/make_golden.py OUT_DIR
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
import transformers
from transformers import (LlamaConfig, Qwen2Config, Qwen3Config, AutoModelForCausalLM,
                          AutoModelForSequenceClassification, AutoModelForTokenClassification)

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-6)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def make_config(kind):
    if kind == "qwen2":  # tied embeddings, qkv bias
        return Qwen2Config(**BASE, tie_word_embeddings=True, rope_theta=10000.0)
    if kind == "llama3":  # llama3 rope scaling, untied head, GQA
        cfg = LlamaConfig(**BASE, tie_word_embeddings=False, rope_theta=10000.0,
                          rope_scaling=dict(LLAMA3_ROPE))
        rp = getattr(cfg, "rope_parameters", None)
        if rp is not None and rp.get("rope_type") != "llama3":
            cfg.rope_parameters = dict(LLAMA3_ROPE, rope_theta=10000.0)
        return cfg
    if kind == "qwen3":  # q/k norm, head_dim (24) != hidden/heads (16)
        return Qwen3Config(**BASE, head_dim=24, tie_word_embeddings=False, rope_theta=1000000.0)
    if kind == "qwen2_critic":  # token classification (value head)
        return Qwen2Config(**BASE, num_labels=1, tie_word_embeddings=False)
    if kind == "llama_rm":  # sequence classification (reward model), attention+mlp bias
        return LlamaConfig(**BASE, num_labels=1, attention_bias=True, mlp_bias=True)
    raise ValueError(kind)


def randomize(model, gen):
    # Larger-than-default weights so attention and norms are far from trivial.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))


def main():
    out_root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/golden"
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    lengths = [5, 11, 17, 1]
    for kind in ["qwen2", "llama3", "qwen3", "qwen2_critic", "llama_rm"]:
        cfg = make_config(kind)
        if kind == "qwen2_critic":
            model = AutoModelForTokenClassification.from_config(cfg, attn_implementation="eager")
        elif kind == "llama_rm":
            model = AutoModelForSequenceClassification.from_config(cfg, attn_implementation="eager")
        else:
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
        model = model.float()
        randomize(model, gen)
        if getattr(cfg, "tie_word_embeddings", False) and hasattr(model, "lm_head"):
            model.lm_head.weight = model.model.embed_tokens.weight
        model.eval()
        out = os.path.join(out_root, kind)
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        seqs = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in lengths]
        ref = {}
        model.zero_grad()
        total = 0.0
        for s, seq in enumerate(seqs):
            ids = torch.tensor([seq])
            res = model(input_ids=ids)
            logits = res.logits[0]
            if kind == "qwen2_critic":
                values = logits[:, 0]
                ref[f"values.{s}"] = values.detach().clone()
                total = total + values.sum()
            elif kind == "llama_rm":
                score = logits[0]  # [num_labels], pooled at the last token
                ref[f"score.{s}"] = score.detach().clone()
                total = total + score.sum()
            else:
                for temp, key in [(1.0, "logprob"), (0.7, "logprob_t07")]:
                    logp = torch.log_softmax(logits[:-1] / temp, dim=-1)
                    tgt = torch.tensor(seq[1:], dtype=torch.long)
                    lp = logp.gather(-1, tgt[:, None])[:, 0] if len(seq) > 1 else logp[:, 0]
                    ref[f"{key}.{s}"] = lp.detach().clone()
                    if temp == 1.0:
                        ent = -(logp.exp() * logp).sum(-1)
                        ref[f"entropy.{s}"] = ent.detach().clone()
                        total = total + lp.sum()
        total.backward()
        for name, p in model.named_parameters():
            if p.grad is not None:
                ref[f"grad.{name}"] = p.grad.detach().clone()
        save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out, "golden.safetensors"))
        with open(os.path.join(out, "inputs.json"), "w") as f:
            json.dump({"sequences": seqs, "transformers": transformers.__version__,
                       "torch": torch.__version__}, f)
        print(kind, "saved", out, "params", sum(p.numel() for p in model.parameters()))
        print(open(os.path.join(out, "config.json")).read())


if __name__ == "__main__":
    main()
