#!/usr/bin/env python3
"""The HuggingFace peer of `verl bench-rollout` (src/cli/cmd_bench_rollout.cpp): batched sampling
with transformers' `generate` on the same shape and workload, printed as one JSON line.

Workload: P prompts of random token ids (--prompt-len each), n samples per prompt (the prompts are
repeated n times: `generate` has no prefix sharing), --new-tokens new tokens per sample with
min_new_tokens = max_new_tokens (no early stop, as in the verl run, which ignores EOS), sampling at
--temperature with top_k 0 and top_p 1. Qwen2ForCausalLM with random N(0, 0.02) bf16 weights and
sdpa attention; the static KV cache is not used (transformers' default dynamic cache). One untimed
warm-up call at the measured batch size first (the first call at a batch size is several times
slower), then --runs timed calls; tokens/s = P * n * new_tokens / mean seconds per call.

  /opt/torch/.venv/bin/python3 tools/bench_rollout_hf.py --shape qwen2.5-0.5b --prompts 256
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train_hf import SHAPES  # noqa: E402  (the shapes table of every HF peer)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=list(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=2)
    a = p.parse_args()
    for name in ("prompts", "n", "prompt_len", "new_tokens", "runs"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")

    import torch
    import transformers

    vocab, hidden, layers, heads, kv, inter, tied = SHAPES[a.shape]
    cfg = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter,
        tie_word_embeddings=tied, max_position_embeddings=32768, rms_norm_eps=1e-6,
        attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.eval()
    with torch.no_grad():
        for prm in model.parameters():
            if prm.dim() >= 2:
                prm.normal_(0.0, 0.02)
    params = sum(prm.numel() for prm in model.parameters())
    g = torch.Generator(device="cuda").manual_seed(1)
    prompts = torch.randint(0, vocab, (a.prompts, a.prompt_len), device="cuda", generator=g)
    ids = prompts.repeat_interleave(a.n, dim=0)
    mask = torch.ones_like(ids)
    kwargs = dict(attention_mask=mask, do_sample=True, temperature=a.temperature, top_k=0,
                  top_p=1.0, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                  pad_token_id=0)

    def run():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, **kwargs)
        torch.cuda.synchronize()
        assert out.shape[1] == a.prompt_len + a.new_tokens, out.shape
        return time.perf_counter() - t0

    torch.cuda.reset_peak_memory_stats()
    warm = run()
    secs = [run() for _ in range(a.runs)]
    mean = sum(secs) / len(secs)
    tokens = a.prompts * a.n * a.new_tokens
    print(json.dumps({
        "bench": "rollout_hf", "impl": f"transformers {transformers.__version__} "
        f"torch {torch.__version__}", "shape": a.shape, "params": params,
        "prompts": a.prompts, "n": a.n, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
        "temperature": a.temperature, "sequences": a.prompts * a.n, "output_tokens": tokens,
        "warmup_s": warm, "seconds": mean, "runs": a.runs,
        "output_tokens_per_s": tokens / mean, "ms_per_decode_step": 1e3 * mean / a.new_tokens,
        "peak_memory_bytes": torch.cuda.max_memory_allocated()}))


if __name__ == "__main__":
    main()
