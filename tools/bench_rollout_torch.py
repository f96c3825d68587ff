#!/usr/bin/env python3
"""The PyTorch peer of bench/bench_rollout_cpu.cpp: the same Qwen2-shaped model generating for 64
sequences (64-token prompts, 64 new tokens, temperature-1 sampling) with a KV cache, fp32 on CPU,
in plain torch (Debian's python3-torch has no transformers). Prints one JSON line."""
import argparse
import json
import time

import torch
import torch.nn.functional as F

from bench_train_torch import Layer, RMSNorm, rotate_half


def attn_step(layer, x, cos, sin, cache, mask):
    """One layer over new tokens x [B, S, C] at positions given by cos/sin, appending to cache."""
    B, S, C = x.shape
    h = layer.attn_norm(x)
    q = layer.q(h).view(B, S, layer.H, layer.D).transpose(1, 2)
    k = layer.k(h).view(B, S, layer.Hkv, layer.D).transpose(1, 2)
    v = layer.v(h).view(B, S, layer.Hkv, layer.D).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    if cache:
        k = torch.cat([cache[0], k], dim=2)
        v = torch.cat([cache[1], v], dim=2)
    cache[:] = [k, v]
    rep = layer.H // layer.Hkv
    kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    att = (q @ kk.transpose(-1, -2)) / (layer.D ** 0.5)
    if mask is not None:
        att = att + mask
    att = torch.softmax(att, dim=-1) @ vv
    x = x + layer.o(att.transpose(1, 2).reshape(B, S, C))
    h = layer.mlp_norm(x)
    return x + layer.down(F.silu(layer.gate(h)) * layer.up(h))


def main():
    p = argparse.ArgumentParser()
    for name, default in [("vocab", 8192), ("hidden", 384), ("layers", 6), ("heads", 6), ("kv-heads", 2),
                          ("intermediate", 1024), ("seqs", 64), ("prompt-len", 64), ("new-tokens", 64),
                          ("threads", 0)]:
        p.add_argument("--" + name, type=int, default=default)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    C, D = a.hidden, a.hidden // a.heads
    emb = torch.nn.Embedding(a.vocab, C)
    layers = torch.nn.ModuleList(Layer(C, a.heads, a.kv_heads, a.intermediate) for _ in range(a.layers))
    norm = RMSNorm(C)
    with torch.no_grad():
        for p_ in list(emb.parameters()) + list(layers.parameters()):
            if p_.dim() == 2:
                p_.normal_(0.0, 0.02)
    inv = 1.0 / (1e6 ** (torch.arange(0, D, 2).float() / D))
    total = a.prompt_len + a.new_tokens
    ang = torch.arange(total).float()[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], -1)
    cos_all, sin_all = ang.cos(), ang.sin()

    def generate(n):
        ids = torch.randint(0, a.vocab, (n, a.prompt_len))
        caches = [[] for _ in layers]
        mask = torch.full((a.prompt_len, a.prompt_len), float("-inf")).triu(1)
        x = emb(ids)
        for l, c in zip(layers, caches):
            x = attn_step(l, x, cos_all[:a.prompt_len], sin_all[:a.prompt_len], c, mask)
        out = 0
        for t in range(a.new_tokens):
            logits = norm(x[:, -1]) @ emb.weight.t()
            tok = torch.multinomial(torch.softmax(logits, -1), 1)
            out += n
            if t + 1 == a.new_tokens:
                break
            pos = a.prompt_len + t
            x = emb(tok)
            for l, c in zip(layers, caches):
                x = attn_step(l, x, cos_all[pos:pos + 1], sin_all[pos:pos + 1], c, None)
        return out

    with torch.no_grad():
        generate(4)  # warm-up
        t0 = time.perf_counter()
        out = generate(a.seqs)
        secs = time.perf_counter() - t0
    print(json.dumps({"bench": "rollout_cpu", "impl": "pytorch " + torch.__version__, "sequences": a.seqs,
                      "prompt_len": a.prompt_len, "new_tokens": a.new_tokens, "seconds": secs,
                      "output_tokens_per_s": out / secs, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
