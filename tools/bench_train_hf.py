#!/usr/bin/env python3
"""The HuggingFace peer of `verl bench train` (src/cli/cmd_bench.cpp): the same training step in
transformers, timed the same way, printed as one JSON line with the same keys.

One step: forward of Qwen2ForCausalLM (attn_implementation "sdpa") over B random sequences of S
tokens, loss = mean next-token NLL = -(1/N) sum of the N = B*(S-1) target log-probs (by default the
model's own loss, labels=input_ids: transformers upcasts the logits to fp32 and runs cross_entropy;
--loss logprob computes log_softmax(logits.float()) and gathers instead, as RL frameworks do),
backward, clip_grad_norm_(1.0), torch.optim.AdamW(fused=True, lr 1e-5, weight decay 0.01).
--compile runs the model under torch.compile; --recompute turns on gradient checkpointing.
--precision bf16 (default) keeps parameters, gradients and AdamW moments in bf16; amp keeps them in
fp32 (as verl.cpp's master weights) and runs the model under torch.autocast(bfloat16).

Needs only torch and transformers:
  /opt/torch/.venv/bin/python3 tools/bench_train_hf.py --shape qwen2.5-0.5b [--compile]
"""
import argparse
import contextlib
import json
import resource
import sys
import time

# Mirrors kBenchShapes in src/cli/bench/shapes.h: the real HF configs (Qwen2, q/k/v bias, RoPE theta
# 1e6, RMSNorm eps 1e-6) and the 12.6M-parameter CPU benchmark shape.
SHAPES = {
    "tiny": (8192, 384, 6, 6, 2, 1024, True),
    "qwen2.5-0.5b": (151936, 896, 24, 14, 2, 4864, True),
    "qwen2.5-1.5b": (151936, 1536, 28, 12, 2, 8960, True),
    "qwen2.5-7b": (152064, 3584, 28, 28, 4, 18944, False),
}


def positive_int(s):
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=list(SHAPES), help="random N(0, 0.02) weights of this shape "
                   "(default qwen2.5-0.5b)")
    p.add_argument("--model", help="HF model directory (its weights) instead of --shape")
    p.add_argument("--batch", type=positive_int, default=8, help="sequences per step (8)")
    p.add_argument("--seq", type=positive_int, default=1024, help="tokens per sequence (1024)")
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps (10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (2)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--recompute", action="store_true",
                   help="gradient checkpointing (non-reentrant), the peer of verl's --recompute")
    p.add_argument("--loss", choices=["model", "logprob"], default="model",
                   help="model: labels= loss (default); logprob: log_softmax + gather")
    p.add_argument("--precision", choices=["bf16", "amp"], default="bf16",
                   help="bf16: pure bf16 training (default); amp: fp32 params + bf16 autocast")
    p.add_argument("--peak-tflops", type=float, default=800.0,
                   help="dense bf16 peak for MFU (800: the H200's measured dense bf16 GEMM peak)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu only to smoke-test this script")
    a = p.parse_args(argv)
    if a.shape and a.model:
        p.error("--shape and --model exclude each other")
    if not a.shape and not a.model:
        a.shape = "qwen2.5-0.5b"
    if a.seq < 2:
        p.error(f"--seq must be >= 2 (a sequence needs a next token), got {a.seq}")
    if a.warmup < 0:
        p.error(f"--warmup must be >= 0, got {a.warmup}")
    if a.peak_tflops <= 0:
        p.error(f"--peak-tflops must be positive, got {a.peak_tflops}")
    return a


def build_model(a, torch, transformers, dtype):
    if a.model:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            a.model, dtype=dtype, attn_implementation="sdpa")
        return model.to(a.device)
    vocab, hidden, layers, heads, kv_heads, inter, tied = SHAPES[a.shape]
    cfg = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=inter,
        tie_word_embeddings=tied, rms_norm_eps=1e-6, max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        use_sliding_window=False, initializer_range=0.02, use_cache=False,
        attn_implementation="sdpa")
    # Built on the device in the target dtype: the init (N(0, initializer_range) matrices, zero
    # biases, unit norms) runs there, with no fp32 host copy of a 7B model.
    # (torch < 2.0 has no device context: it builds on the CPU and moves; only smoke tests see it.)
    on_device = (torch.device(a.device) if hasattr(torch.device, "__enter__")
                 else contextlib.nullcontext())
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with on_device:
            model = transformers.Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    return model.to(a.device)


def main(argv):
    a = parse_args(argv)
    import torch
    import transformers

    mode = "compile" if a.compile else "eager"
    if a.compile and a.warmup == 0:
        print("warning: --compile with --warmup 0 times the compilation too", file=sys.stderr)
    cuda = a.device == "cuda"
    out = {"bench": "train_hf", "impl": f"transformers {transformers.__version__} torch "
           f"{torch.__version__}", "mode": mode, "device": a.device,
           "shape": a.shape, "model": a.model, "batch": a.batch, "seq": a.seq}
    if cuda and not torch.cuda.is_available():
        out["error"] = "--device cuda: torch sees no CUDA device"
        print(json.dumps(out))
        return 1
    torch.manual_seed(0)
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    try:
        model = build_model(a, torch, transformers, dtype)
        model.train()
        model.config.use_cache = False
        if a.recompute:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        cfg = model.config
        params = list(model.parameters())  # a tied embedding appears once
        n_params = sum(p.numel() for p in params)
        init_std = None
        if not a.model:  # check the random init is the one we promise (N(0, 0.02))
            init_std = model.get_input_embeddings().weight.float().std().item()
        if cuda:  # the peak from here on: the model stays allocated, construction scratch does not
            torch.cuda.reset_peak_memory_stats()
        fwd = torch.compile(model) if a.compile else model
        opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.01, **({"fused": True} if cuda else {}))
        ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device=a.device)

        def loss_fn():
            if a.loss == "model":
                return fwd(input_ids=ids, labels=ids, use_cache=False).loss
            logits = fwd(input_ids=ids, use_cache=False).logits
            lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            lp = lp.gather(-1, ids[:, 1:, None]).squeeze(-1)
            return -lp.sum() / lp.numel()

        def step():
            opt.zero_grad(set_to_none=True)
            if a.precision == "amp":
                with torch.autocast(a.device, dtype=torch.bfloat16):
                    loss = loss_fn()
            else:
                loss = loss_fn()
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            return loss, norm

        def sync():
            if cuda:
                torch.cuda.synchronize()

        device_used = 0
        times = []
        first_step_s = None
        for i in range(a.warmup + a.steps):
            t0 = time.perf_counter()
            loss, norm = step()
            sync()
            dt = time.perf_counter() - t0
            if i == 0:
                first_step_s = dt  # includes compilation under --compile
            if i >= a.warmup:
                times.append(dt)
            if cuda:
                free, total = torch.cuda.mem_get_info()
                device_used = max(device_used, total - free)
    except torch.cuda.OutOfMemoryError as e:
        out["error"] = "out of memory: " + str(e).split("\n")[0]
        print(json.dumps(out))
        return 1

    step_s = sum(times) / len(times)
    tokens = a.batch * a.seq
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    flops = (6.0 * n_params * tokens + 6.0 * cfg.num_hidden_layers * a.batch * a.seq * a.seq *
             cfg.num_attention_heads * head_dim)
    tflops = flops / step_s / 1e12
    if cuda:
        peak_memory = torch.cuda.max_memory_allocated()
    else:
        peak_memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.update({
        "device_name": torch.cuda.get_device_name() if cuda else "cpu",
        "params": n_params,
        "tokens_per_step": tokens,
        "steps": a.steps,
        "warmup": a.warmup,
        "step_ms": step_s * 1e3,
        "step_ms_min": min(times) * 1e3,
        "first_step_s": first_step_s,
        "tokens_per_s": tokens / step_s,
        "model_flops_per_step": flops,
        "tflops": tflops,
        "mfu": tflops / a.peak_tflops,
        "peak_tflops": a.peak_tflops,
        "peak_memory_bytes": peak_memory,
        "recompute": a.recompute,
        "loss": loss.item(),
        "grad_norm": norm.item(),
        "loss_impl": a.loss,
        "precision": a.precision,
        "attn_implementation": "sdpa",
        "init_std": init_std,
    })
    if cuda:
        out["max_memory_reserved_bytes"] = torch.cuda.max_memory_reserved()
        out["device_used_peak_bytes"] = device_used  # total - free, as verl.cpp's peak_memory_bytes
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
