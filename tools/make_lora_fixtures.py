#!/usr/bin/env python3
"""Makes the fixtures that pin our LoRA adapters to PEFT (fp32, eager attention).

For the golden base models under tests/fixtures/golden/{qwen2,llama3,qwen3} (tools/make_golden.py)
it builds a PEFT LoRA adapter on all seven projections (q/k/v/o, gate/up/down) with nonzero B
(a fresh PEFT adapter has B = 0 and would test nothing), then writes under
tests/fixtures/lora/<name>/:
  adapter_config.json, adapter_model.safetensors   the adapter as PEFT saves it
  golden.safetensors   reference outputs for the base model's inputs.json sequences:
    logprob.<s>, entropy.<s>   log p(x[i+1] | x[:i+1]) and entropy with the adapter (temperature 1)
    base_logprob.<s>           the same with the adapter disabled (the reference policy)
    grad.<peft tensor name>    d(sum of all log-probs)/d(adapter tensor), the adapters only
    merged.<hf name>           the base weight with the adapter merged (merge_and_unload), for
                               the projections the adapter touches
  info.json                    {"r", "alpha", "target_modules", versions}
The adapters use different ranks and alphas per model, and llama3 uses rsLoRA's scale
(alpha / sqrt(r)) so that use_rslora is read.
Run where transformers and peft are installed (the GPU machine):
  python3 tools/make_lora_fixtures.py [GOLDEN_DIR] [OUT_DIR]
"""
import json
import os
import sys

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SETUPS = {
    "qwen2": dict(r=4, lora_alpha=8, use_rslora=False),
    "llama3": dict(r=8, lora_alpha=16, use_rslora=True),
    "qwen3": dict(r=2, lora_alpha=3, use_rslora=False),
}


def logprobs(model, seq):
    logits = model(input_ids=torch.tensor([seq])).logits[0]
    logp = torch.log_softmax(logits[:-1], dim=-1)
    tgt = torch.tensor(seq[1:], dtype=torch.long)
    lp = logp.gather(-1, tgt[:, None])[:, 0] if len(seq) > 1 else logp[:, 0]
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


def main():
    golden = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/golden"
    out_root = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/lora"
    gen = torch.Generator().manual_seed(4321)
    for name, setup in SETUPS.items():
        base_dir = os.path.join(golden, name)
        seqs = json.load(open(os.path.join(base_dir, "inputs.json")))["sequences"]
        model = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager",
                                                     dtype=torch.float32)
        model.eval()
        cfg = LoraConfig(target_modules=TARGETS, lora_dropout=0.0, bias="none",
                         task_type="CAUSAL_LM", **setup)
        pm = get_peft_model(model, cfg)
        with torch.no_grad():
            for pname, p in pm.named_parameters():
                if "lora_A" in pname or "lora_B" in pname:
                    p.copy_(0.2 * torch.randn(p.shape, generator=gen))
        pm.eval()
        ref = {}
        pm.zero_grad()
        total = 0.0
        for s, seq in enumerate(seqs):
            lp, ent = logprobs(pm, seq)
            ref[f"logprob.{s}"] = lp.detach().clone()
            ref[f"entropy.{s}"] = ent.detach().clone()
            total = total + lp.sum()
        total.backward()
        out = os.path.join(out_root, name)
        os.makedirs(out, exist_ok=True)
        pm.save_pretrained(out, safe_serialization=True)
        saved = load_file(os.path.join(out, "adapter_model.safetensors"))
        grads = {}
        for pname, p in pm.named_parameters():
            if p.grad is not None:
                grads[pname] = p.grad.detach().clone()
        # PEFT's parameter names carry the adapter name ("...lora_A.default.weight"); the saved
        # tensors do not.
        for key in saved:
            match = [g for g in grads if g.replace(".default.", ".") == key]
            assert len(match) == 1, (key, match[:3])
            ref[f"grad.{key}"] = grads[match[0]]
        with torch.no_grad(), pm.disable_adapter():
            for s, seq in enumerate(seqs):
                lp, _ = logprobs(pm, seq)
                ref[f"base_logprob.{s}"] = lp.detach().clone()
        merged = pm.merge_and_unload()
        for hf_name, p in merged.named_parameters():
            if any(f".{t}." in hf_name for t in TARGETS):
                ref[f"merged.{hf_name}"] = p.detach().clone()
        save_file({k: v.contiguous() for k, v in ref.items()},
                  os.path.join(out, "golden.safetensors"))
        with open(os.path.join(out, "info.json"), "w") as f:
            json.dump({"target_modules": TARGETS, **setup, "transformers": transformers.__version__,
                       "peft": peft.__version__, "torch": torch.__version__}, f)
        print(name, "saved", out, "tensors", len(saved), "keys", len(ref))
        print(sorted(saved)[:4])


if __name__ == "__main__":
    main()
