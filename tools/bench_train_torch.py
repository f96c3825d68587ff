#!/usr/bin/env python3
"""The PyTorch peer of bench/bench_train_cpu.cpp: the same Qwen2-shaped model (tied embeddings,
qkv bias, GQA, RoPE, SwiGLU, RMSNorm), the same batch, forward + backward + torch.optim.AdamW, fp32
on CPU. Written in plain torch so it runs on Debian's python3-torch without transformers.
Prints one JSON line."""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F


class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, C, H, Hkv, F_):
        super().__init__()
        self.H, self.Hkv, self.D = H, Hkv, C // H
        self.attn_norm, self.mlp_norm = RMSNorm(C), RMSNorm(C)
        self.q = torch.nn.Linear(C, H * self.D)
        self.k = torch.nn.Linear(C, Hkv * self.D)
        self.v = torch.nn.Linear(C, Hkv * self.D)
        self.o = torch.nn.Linear(H * self.D, C, bias=False)
        self.gate = torch.nn.Linear(C, F_, bias=False)
        self.up = torch.nn.Linear(C, F_, bias=False)
        self.down = torch.nn.Linear(F_, C, bias=False)

    def forward(self, x, cos, sin, mask):
        B, S, C = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(B, S, self.H, self.D).transpose(1, 2)
        k = self.k(h).view(B, S, self.Hkv, self.D).transpose(1, 2)
        v = self.v(h).view(B, S, self.Hkv, self.D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.H // self.Hkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.D) + mask
        att = torch.softmax(att, dim=-1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(B, S, C))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def main():
    p = argparse.ArgumentParser()
    for name, default in [("vocab", 8192), ("hidden", 384), ("layers", 6), ("heads", 6),
                          ("kv-heads", 2), ("intermediate", 1024), ("batch", 4), ("seq", 256),
                          ("steps", 3), ("threads", 0)]:
        p.add_argument("--" + name, type=int, default=default)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    C, D = a.hidden, a.hidden // a.heads
    emb = torch.nn.Embedding(a.vocab, C)
    layers = torch.nn.ModuleList(Layer(C, a.heads, a.kv_heads, a.intermediate) for _ in range(a.layers))
    norm = RMSNorm(C)
    params = list(emb.parameters()) + list(layers.parameters()) + list(norm.parameters())
    with torch.no_grad():  # the same init as ours: N(0, 0.02) matrices, zero biases, unit norms
        for p_ in params:
            if p_.dim() == 2:
                p_.normal_(0.0, 0.02)
        for l in layers:
            l.q.bias.zero_(); l.k.bias.zero_(); l.v.bias.zero_()
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq))
    inv = 1.0 / (1e6 ** (torch.arange(0, D, 2).float() / D))
    ang = torch.arange(a.seq).float()[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos(), ang.sin()
    mask = torch.full((a.seq, a.seq), float("-inf")).triu(1)

    def step():
        opt.zero_grad(set_to_none=True)
        x = emb(ids)
        for l in layers:
            x = l(x, cos, sin, mask)
        logits = norm(x) @ emb.weight.t()  # tied head
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, a.vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()

    step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    secs = (time.perf_counter() - t0) / a.steps
    tokens = a.batch * a.seq
    print(json.dumps({"bench": "train_step_cpu", "impl": "pytorch " + torch.__version__,
                      "params": sum(p.numel() for p in params), "tokens_per_step": tokens,
                      "seconds_per_step": secs, "tokens_per_s": tokens / secs,
                      "threads": torch.get_num_threads(), "loss": loss}))


if __name__ == "__main__":
    main()
