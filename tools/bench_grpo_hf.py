#!/usr/bin/env python3
"""The HuggingFace peer of `verl bench grpo-step` (src/cli/bench/grpo_step.cpp): one TRL-style GRPO
step in transformers, timed phase by phase, printed as one JSON line with the same keys.

One step on random prompts (G prompts of P tokens, n samples each, B = G n sequences):
  gen           model.generate over the B = G n rows (prompts repeated n times, as TRL does):
                sampling at temperature 1, no top-k/top-p, min_new_tokens = max_new_tokens = R
                (EOS cannot end a sample), KV cache on.
  reward        the fraction of even token ids in each response (the same synthetic reward as ours;
                timed inside adv).
  old_log_prob  forward under no_grad over prompt + response in micro-batches of at most
                --micro-tokens tokens, logits of the response positions only (logits_to_keep),
                log_softmax in fp32, gather.
  ref           (--ref) the same with a frozen deep copy of the initial model.
  adv           GRPO: (r - group mean) / (group std + 1e-6), std unbiased.
  update_actor  one PPO-clip epoch (clip 0.2, token-mean over all B R response tokens; with --ref
                plus 0.001 x the k3 KL), backward per micro-batch, clip_grad_norm_(1.0),
                torch.optim.AdamW(fused=True, lr 1e-6, weight decay 0.01).
Parameters, gradients and AdamW moments are bf16 (the usual HF speed setting, as
tools/bench_train_hf.py's default). Memory per phase: torch.cuda.max_memory_allocated() within the
phase (peak_memory_bytes) and cudaMemGetInfo total - free at its end (device_used_bytes, the
measure verl.cpp reports under both keys).

--lora RANK: the HF + PEFT peer of verl's LoRA GRPO (actor_rollout_ref.model.lora_rank, lora_alpha,
target_modules=all-linear): peft.LoraConfig(r=RANK, lora_alpha=--lora-alpha (2 RANK), all-linear,
no dropout) on the bf16 base; only the adapters train (PEFT keeps them in fp32), and --ref's
reference is the base with the adapters switched off (disable_adapter, verl's ref_in_actor), not a
copy. --recompute turns on gradient checkpointing (non-reentrant), the peer of
actor_rollout_ref.model.enable_gradient_checkpointing.

Needs torch and transformers (and peft for --lora):
  /opt/torch/.venv/bin/python3 tools/bench_grpo_hf.py --shape qwen2.5-0.5b [--ref]
  /opt/torch/.venv/bin/python3 tools/bench_grpo_hf.py --shape qwen3-8b --lora 64 --ref --recompute
"""
import argparse
import contextlib
import copy
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train_hf import SHAPES, build_model, positive_int  # noqa: E402  (the same shapes and init)

PHASES = ("gen", "old_log_prob", "ref", "adv", "update_actor")
# Qwen3 shapes (q/k norm, head_dim 128), built here: vocab, hidden, layers, heads, kv heads, head
# dim, intermediate, tied (Qwen3-8B's config.json).
QWEN3_SHAPES = {"qwen3-8b": (151936, 4096, 36, 32, 8, 128, 12288, False)}
CLIP_RATIO = 0.2
KL_COEF = 0.001


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=list(SHAPES) + list(QWEN3_SHAPES),
                   help="random N(0, 0.02) weights of this shape (default qwen2.5-0.5b)")
    p.add_argument("--model", help="HF model directory (its weights) instead of --shape")
    p.add_argument("--prompts", type=positive_int, default=32, help="prompts per step (32)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt, the GRPO group (8)")
    p.add_argument("--prompt-len", type=positive_int, default=256, help="tokens per prompt (256)")
    p.add_argument("--new-tokens", type=positive_int, default=256,
                   help="tokens generated per sample (256)")
    p.add_argument("--steps", type=positive_int, default=3, help="timed steps (3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (1)")
    p.add_argument("--micro-tokens", type=positive_int, default=8192,
                   help="token budget of a log-prob / update micro-batch (8192)")
    p.add_argument("--ref", action="store_true", help="a frozen reference model: ref log-probs "
                   "and the k3 KL loss (coef 0.001)")
    p.add_argument("--lora", type=int, default=0, metavar="RANK",
                   help="PEFT LoRA of this rank on all linear layers; only the adapters train")
    p.add_argument("--lora-alpha", type=float, default=None,
                   help="LoRA alpha (default 2 x RANK, verl's lora_alpha=128 at rank 64)")
    p.add_argument("--recompute", action="store_true",
                   help="gradient checkpointing (non-reentrant) in the update")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu only to smoke-test this script (use --shape tiny)")
    a = p.parse_args(argv)
    if a.shape and a.model:
        p.error("--shape and --model exclude each other")
    if not a.shape and not a.model:
        a.shape = "qwen2.5-0.5b"
    if a.n < 2:
        p.error(f"--n must be >= 2 (GRPO normalises rewards within a prompt's group), got {a.n}")
    if a.warmup < 0:
        p.error(f"--warmup must be >= 0, got {a.warmup}")
    seq = a.prompt_len + a.new_tokens
    if a.micro_tokens < seq:
        p.error(f"--micro-tokens {a.micro_tokens} is below one sequence of --prompt-len + "
                f"--new-tokens = {seq} tokens")
    if a.lr < 0:
        p.error(f"--lr must be >= 0, got {a.lr}")
    if a.lora < 0:
        p.error(f"--lora must be a rank >= 1 (0: off), got {a.lora}")
    if a.lora_alpha is None:
        a.lora_alpha = 2.0 * a.lora
    elif not a.lora:
        p.error("--lora-alpha needs --lora RANK")
    return a


def build_qwen3(a, torch, transformers, dtype):
    """Random N(0, 0.02) weights of a Qwen3 shape, built on the device in `dtype`."""
    vocab, hidden, layers, heads, kv_heads, head_dim, inter, tied = QWEN3_SHAPES[a.shape]
    cfg = transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        intermediate_size=inter, tie_word_embeddings=tied, rms_norm_eps=1e-6,
        max_position_embeddings=40960,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        use_sliding_window=False, initializer_range=0.02, use_cache=False,
        attn_implementation="sdpa")
    on_device = (torch.device(a.device) if hasattr(torch.device, "__enter__")
                 else contextlib.nullcontext())
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with on_device:
            model = transformers.Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    return model.to(a.device)


def main(argv):
    a = parse_args(argv)
    import torch
    import transformers

    cuda = a.device == "cuda"
    G, n, P, R = a.prompts, a.n, a.prompt_len, a.new_tokens
    B, seq = G * n, a.prompt_len + a.new_tokens
    rows_per_micro = max(1, a.micro_tokens // seq)  # every sequence has P + R tokens
    out = {"bench": "grpo_step_hf", "impl": f"transformers {transformers.__version__} torch "
           f"{torch.__version__}", "device": a.device, "shape": a.shape, "model": a.model,
           "prompts": G, "n": n, "sequences": B, "prompt_len": P, "new_tokens": R,
           "micro_tokens": a.micro_tokens, "micro_batches": -(-B // rows_per_micro),
           "ref": a.ref, "steps": a.steps, "warmup": a.warmup, "lr": a.lr,
           "lora_rank": a.lora, "lora_alpha": a.lora_alpha if a.lora else None,
           "recompute": a.recompute}
    if cuda and not torch.cuda.is_available():
        out["error"] = "--device cuda: torch sees no CUDA device"
        print(json.dumps(out))
        return 1
    torch.manual_seed(a.seed)
    try:
        if a.shape in QWEN3_SHAPES:
            model = build_qwen3(a, torch, transformers, torch.bfloat16)
        else:
            model = build_model(a, torch, transformers, torch.bfloat16)
        cfg = model.config
        vocab = cfg.vocab_size
        n_params = sum(p.numel() for p in model.parameters())
        if a.recompute:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        ref_model = None
        base_off = contextlib.nullcontext  # the reference pass's context (LoRA: adapters off)
        if a.lora:
            import peft
            out["impl"] += f" peft {peft.__version__}"
            lcfg = peft.LoraConfig(r=a.lora, lora_alpha=a.lora_alpha, target_modules="all-linear",
                                   lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
            model = peft.get_peft_model(model, lcfg)
            if a.ref:
                ref_model = model  # the base alone under disable_adapter(): no second copy
                base_off = model.disable_adapter
        elif a.ref:
            ref_model = copy.deepcopy(model).eval()
            for p in ref_model.parameters():
                p.requires_grad_(False)
        params = [p for p in model.parameters() if p.requires_grad]
        out["trainable_params"] = sum(p.numel() for p in params)
        opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                **({"fused": True} if cuda else {}))
        # build_model turned the KV cache off (a training model); generate needs it.
        model.config.use_cache = True
        model.generation_config.use_cache = True
        gen_kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                          max_new_tokens=R, min_new_tokens=R,
                          pad_token_id=getattr(cfg, "pad_token_id", None) or 0)

        def sync():
            if cuda:
                torch.cuda.synchronize()

        def response_logprobs(m, ids):
            """Log-probs [b, R] of the response tokens of ids [b, P + R] (fp32)."""
            logits = m(input_ids=ids, use_cache=False, logits_to_keep=R + 1).logits[:, :-1]
            lp = torch.log_softmax(logits.float(), dim=-1)
            return lp.gather(-1, ids[:, P:, None]).squeeze(-1)

        def micro_batches():
            return [slice(i, min(B, i + rows_per_micro)) for i in range(0, B, rows_per_micro)]

        def step(gen):
            """One GRPO step; returns per-phase seconds, memory and the step's metrics."""
            secs, mem_peak, mem_used, m = {}, {}, {}, {}
            state = {}

            def phase(name, fn):
                sync()
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                fn()
                sync()
                secs[name] = time.perf_counter() - t0
                if cuda:
                    mem_peak[name] = torch.cuda.max_memory_allocated()
                    free, total = torch.cuda.mem_get_info()
                    mem_used[name] = total - free

            def do_gen():
                prompts = torch.randint(0, vocab, (G, P), device=a.device, generator=gen)
                inp = prompts.repeat_interleave(n, dim=0)
                model.eval()
                with torch.no_grad():
                    seqs = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp),
                                          **gen_kwargs)
                assert seqs.shape == (B, P + R), seqs.shape
                state["seqs"] = seqs
                m["output_tokens"] = (seqs.shape[1] - P) * B

            def do_logprobs(mdl, key, ctx=contextlib.nullcontext):
                def fn():
                    mdl.eval()
                    with torch.no_grad(), ctx():
                        state[key] = torch.cat([response_logprobs(mdl, state["seqs"][s])
                                                for s in micro_batches()])
                return fn

            def do_adv():
                resp = state["seqs"][:, P:]
                scores = (resp % 2 == 0).float().mean(dim=-1)  # the synthetic reward
                grouped = scores.view(G, n)
                adv = (grouped - grouped.mean(dim=1, keepdim=True)) / (
                    grouped.std(dim=1, keepdim=True) + 1e-6)
                state["adv"] = adv.reshape(B, 1)  # broadcast over the response tokens
                m["reward_mean"] = scores.mean().item()

            def do_update():
                model.train()
                seqs, old, adv = state["seqs"], state["old"], state["adv"]
                n_tokens = float(B * (seqs.shape[1] - P))
                # Metrics stay on the device until the step ends (no host sync per micro-batch).
                pg_loss = kl_loss = clipfrac = ppo_kl = torch.zeros((), device=a.device)
                opt.zero_grad(set_to_none=True)
                for s in micro_batches():
                    logp = response_logprobs(model, seqs[s])
                    ratio = torch.exp(torch.clamp(logp - old[s], -20.0, 20.0))
                    l1 = -adv[s] * ratio
                    l2 = -adv[s] * torch.clamp(ratio, 1 - CLIP_RATIO, 1 + CLIP_RATIO)
                    pg = torch.maximum(l1, l2)
                    pg = torch.where(adv[s] < 0, torch.minimum(pg, -adv[s] * 3.0), pg)  # dual clip
                    loss = pg.sum() / n_tokens
                    pg_loss = pg_loss + loss.detach()
                    clipfrac = clipfrac + (l2 > l1).float().sum() / n_tokens
                    ppo_kl = ppo_kl + (old[s] - logp).detach().sum() / n_tokens
                    if ref_model is not None:
                        x = torch.clamp(state["ref"][s] - logp, -20.0, 20.0)
                        kl = torch.clamp(torch.exp(x) - x - 1, -10.0, 10.0)  # k3, low_var_kl
                        kl_term = kl.sum() / n_tokens
                        kl_loss = kl_loss + kl_term.detach()
                        loss = loss + KL_COEF * kl_term
                    loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                m.update(pg_loss=pg_loss.item(), pg_clipfrac=clipfrac.item(), ppo_kl=ppo_kl.item(),
                         kl_loss=kl_loss.item() if ref_model is not None else None,
                         grad_norm=norm.item())

            t0 = time.perf_counter()
            phase("gen", do_gen)
            phase("old_log_prob", do_logprobs(model, "old"))
            if ref_model is not None:
                phase("ref", do_logprobs(ref_model, "ref", base_off))
            phase("adv", do_adv)
            phase("update_actor", do_update)
            m["step_s"] = time.perf_counter() - t0
            m["tokens"] = B * seq
            return secs, mem_peak, mem_used, m

        gen = torch.Generator(device=a.device)
        gen.manual_seed(a.seed + 17)
        static_used = 0
        if cuda:
            free, total = torch.cuda.mem_get_info()
            static_used = total - free
        sums = {k: 0.0 for k in PHASES}
        peak, used = {}, {}
        step_sum, step_min, tokens_sum, gen_sum = 0.0, float("inf"), 0, 0.0
        first_step_s = last = None
        for i in range(a.warmup + a.steps):
            secs, mem_peak, mem_used, last = step(gen)
            if i == 0:
                first_step_s = last["step_s"]
            for k, v in mem_peak.items():
                peak[k] = max(peak.get(k, 0), v)
            for k, v in mem_used.items():
                used[k] = max(used.get(k, 0), v)
            if i < a.warmup:
                continue
            for k, v in secs.items():
                sums[k] += v
            step_sum += last["step_s"]
            step_min = min(step_min, last["step_s"])
            tokens_sum += last["tokens"]
            gen_sum += secs["gen"]
    except torch.cuda.OutOfMemoryError as e:
        out["error"] = "out of memory: " + str(e).split("\n")[0]
        print(json.dumps(out))
        return 1

    steps = float(a.steps)
    phase_s = {k: sums[k] / steps for k in PHASES}
    phase_s["step"] = step_sum / steps
    out.update({
        "device_name": torch.cuda.get_device_name() if cuda else "cpu",
        "params": n_params,
        "phase_s": phase_s,
        "phase_share": {k: sums[k] / step_sum for k in PHASES},
        "step_s": step_sum / steps,
        "step_s_min": step_min,
        "first_step_s": first_step_s,
        "tokens_per_step": tokens_sum / steps,
        "tokens_per_s": tokens_sum / step_sum,
        "rollout_output_tokens": last["output_tokens"],
        "rollout_generate_s": gen_sum / steps,
        "rollout_output_tokens_per_s": last["output_tokens"] / (gen_sum / steps),
        "peak_memory_bytes": peak,
        "device_used_bytes": used,
        "peak_memory_bytes_max": max(peak.values()) if peak else None,
        "static_memory_bytes": static_used,
        "reward_mean": last["reward_mean"],
        "pg_loss": last["pg_loss"],
        "pg_clipfrac": last["pg_clipfrac"],
        "ppo_kl": last["ppo_kl"],
        "kl_loss": last["kl_loss"],
        "grad_norm": last["grad_norm"],
        "attn_implementation": "sdpa",
        "precision": "bf16",
    })
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
