#!/usr/bin/env python3
"""Projects a PPO step of a Llama-3-8B (or Llama-2-13B) shape on 8..64 GPUs from single-GPU
measurements (bench/scaling_inputs.sh) and stated link bandwidths; prints the Markdown tables of
docs/scaling.md. Every input is a measured figure or a constant named below; the model of the step
is written out in docs/scaling.md ("How the projection is made").

    python3 tools/scaling_projection.py scaling_inputs.jsonl [--shape llama3-8b]
"""
import argparse
import json
import math
import sys

# The step (the seed's section 4 runs "reward modeling + PPO" on Llama-3-8B; its batch is not
# given, so verl's PPO examples' figures): 1024 prompts x 1 response, 512 prompt + 512 response
# tokens, 4 mini-batches (ppo_mini_batch_size 256), ppo_epochs 1, micro-batches of at most 16384
# tokens a GPU (ppo_max_token_len_per_gpu), actor + critic trained, reference + reward model
# forward only, every model the same shape.
PROMPTS, PROMPT_LEN, RESPONSE_LEN = 1024, 512, 512
MINI_BATCHES = 4
MICRO_TOKENS = 16384

# Links (per GPU, one direction). H100 SXM: NVLink 4 at 900 GB/s bidirectional (NVIDIA H100
# datasheet) = 450 GB/s each way; one 400 Gb/s NDR InfiniBand NIC per GPU (DGX H100 reference
# architecture: 8 ConnectX-7 per node) = 50 GB/s. Ring collectives reach about 80% of the link
# (the share nccl-tests' bus bandwidth reports at large sizes), an assumption stated as such.
NVLINK_BPS = 450e9
IB_BPS = 50e9
LINK_EFFICIENCY = 0.8
GPUS_PER_NODE = 8


def load(path):
    train, rollout, device = {}, {}, None
    for line in open(path):
        line = line.strip()
        if line.startswith("# ") and device is None and "failed" not in line:
            device = line[2:]
        if not line or line.startswith("#"):
            continue
        j = json.loads(line)
        if j.get("bench") == "train":
            train[(j["shape"], j["layers"])] = j
        elif j.get("bench") == "rollout":
            rollout[(j["model"], j["sequences"])] = j
    return train, rollout, device


def full_layers(shape):
    return {"llama3-8b": 32, "llama2-13b": 40}[shape]


def params_of(shape, train):
    """Whole-model parameters from the 2- and 4-layer counts (linear in the layer count)."""
    p2, p4 = train[(shape, 2)]["params"], train[(shape, 4)]["params"]
    per_layer = (p4 - p2) / 2
    return p2 + per_layer * (full_layers(shape) - 2)


def train_seconds_per_token(shape, train):
    """Forward + backward + AdamW of the whole model, seconds per token on one GPU: the per-layer
    time from the 4- and 2-layer difference, the rest (embedding, LM head) from the 2-layer run."""
    a, b = train[(shape, 2)], train[(shape, 4)]
    tokens = a["tokens_per_step"]
    assert b["tokens_per_step"] == tokens
    layer = (b["step_ms"] - a["step_ms"]) / 2 / 1e3
    head = a["step_ms"] / 1e3 - 2 * layer
    return (full_layers(shape) * layer + head) / tokens, layer / tokens, head / tokens


def generation_seconds(shape, rollout, seqs):
    """Measured seconds to generate `seqs` sequences of 512 + 512 tokens on one GPU; between
    measured points, linear in the sequence count."""
    pts = sorted((s, r["seconds"]) for (m, s), r in rollout.items() if m == shape)
    if not pts:
        raise SystemExit(f"no rollout measurements for {shape}")
    for (s0, t0), (s1, t1) in zip(pts, pts[1:]):
        if s0 <= seqs <= s1:
            return t0 + (t1 - t0) * (seqs - s0) / (s1 - s0)
    if seqs <= pts[0][0]:
        return pts[0][1]
    (s0, t0), (s1, t1) = pts[-2], pts[-1]
    return t1 + (t1 - t0) * (seqs - s1) / (s1 - s0)


def link_bps(n):
    return (NVLINK_BPS if n <= GPUS_PER_NODE else IB_BPS) * LINK_EFFICIENCY


def project(shape, train, rollout):
    P = params_of(shape, train)
    per_tok, _, _ = train_seconds_per_token(shape, train)
    fwd_per_tok = per_tok / 3  # a forward is about a third of forward + backward (2:1 FLOPs)
    tokens = PROMPTS * (PROMPT_LEN + RESPONSE_LEN)
    rows = []
    base = None
    for n in (8, 16, 32, 64):
        tok_gpu = tokens / n
        gen = generation_seconds(shape, rollout, PROMPTS // n)
        # actor old log-probs, reference, critic values, reward model: four forward passes
        logprob = 4 * tok_gpu * fwd_per_tok
        update = 2 * tok_gpu * per_tok  # actor and critic, one epoch
        compute = gen + logprob + update
        # Bytes each GPU sends per step (ring: (n-1)/n of the buffer), ZeRO-3 on the actor and
        # critic with bf16 weight gathers layer by layer in every micro-batch's forward and again
        # in its backward, fp32 gradients reduce-scattered once per mini-batch; the reference and
        # reward model are whole replicas (no traffic); the reshard for generation gathers the
        # actor's bf16 weights once (TP 1: each GPU generates with the whole model).
        ring = (n - 1) / n
        micro_pass = max(1, math.ceil(tok_gpu / MICRO_TOKENS))
        micro_update = MINI_BATCHES * max(1, math.ceil(tok_gpu / MINI_BATCHES / MICRO_TOKENS))
        gathers = 1 + 2 * (micro_pass + 2 * micro_update)  # reshard; actor + critic passes
        gather_bytes = gathers * 2 * P * ring
        reduce_bytes = 2 * MINI_BATCHES * 4 * P * ring
        comm_bytes = gather_bytes + reduce_bytes
        comm = comm_bytes / link_bps(n)
        serial = compute + comm
        # With the gathers prefetched and the reductions overlapped with backward, only what
        # exceeds the training compute it can hide behind stays on the critical path.
        overlapped = gen + max(logprob + update, comm)
        if base is None:
            base = (serial, overlapped)
        rows.append(dict(n=n, gen=gen, logprob=logprob, update=update, comm_gb=comm_bytes / 1e9,
                         comm=comm, serial=serial, overlapped=overlapped,
                         speedup_serial=base[0] / serial,
                         speedup_overlapped=base[1] / overlapped,
                         share=comm / serial))
    return P, per_tok, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs")
    ap.add_argument("--shape", default="llama3-8b", choices=["llama3-8b", "llama2-13b"])
    a = ap.parse_args()
    train, rollout, device = load(a.inputs)
    if (a.shape, 2) not in train or (a.shape, 4) not in train:
        sys.exit(f"{a.inputs}: no 2- and 4-layer bench train lines for {a.shape}")
    P, per_tok, rows = project(a.shape, train, rollout)
    _, layer, head = train_seconds_per_token(a.shape, train)
    print(f"{a.shape}: {P / 1e9:.2f}e9 parameters; measured on {device}: forward + backward + "
          f"AdamW {layer * 1e6:.2f} us per token per layer, {head * 1e6:.2f} us per token for "
          f"the embedding and LM head, {per_tok * 1e3:.3f} ms per token for the whole model\n")
    print("| GPUs | generation s | log-prob passes s | updates s | comm GB/GPU | comm s | "
          "step s (serial) | speedup vs 8 | comm share | step s (overlapped) | speedup vs 8 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['gen']:.1f} | {r['logprob']:.1f} | {r['update']:.1f} | "
              f"{r['comm_gb']:.0f} | {r['comm']:.1f} | {r['serial']:.1f} | "
              f"{r['speedup_serial']:.2f}x | {100 * r['share']:.1f}% | {r['overlapped']:.1f} | "
              f"{r['speedup_overlapped']:.2f}x |")


if __name__ == "__main__":
    main()
