#!/usr/bin/env bash
# Data parallel on the CPU: the demo config under `mpirun -np 2` against one process with the same
# global batch (16 prompts x 4 samples a step, no shuffling). Checks, per step, critic/score/mean,
# response_length/mean, actor/pg_loss and actor/grad_norm within 1e-4 relative and the exported
# model's log-probs within 1e-5; the same with ZeRO-1 and for PPO with a critic (with and without
# ZeRO-1); a checkpoint saved at 2 ranks
# resumed at 1 and the reverse; kill -9 of one rank (the job ends, the dead rank is named, the last
# checkpoint resumes); a rank count that disagrees with trainer.nnodes x n_gpus_per_node.
# Usage: data_parallel.sh VERL_BINARY REPO_ROOT WORK_DIR
set -uo pipefail
verl=$1 root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
pass=0 fail=0
check() {
  local what=$1
  shift
  if "$@"; then pass=$((pass + 1)); else echo "FAIL: $what"; fail=$((fail + 1)); fi
}
common=(actor_rollout_ref.model.path="$root/assets/demo/model" data.train_files="[$root/assets/demo/train.jsonl]"
  data.val_files="[$root/assets/demo/val.jsonl]" data.shuffle=false data.train_batch_size=16
  actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=16 trainer.logger=[jsonl]
  trainer.val_before_train=false trainer.nnodes=1 actor_rollout_ref.nccl_timeout=60)
# run RANKS DIR [overrides...]
run() {
  local ranks=$1 dir=$2
  shift 2
  if [ "$ranks" = 1 ]; then
    OMP_NUM_THREADS=1 "$verl" train "$root/configs/demo.yaml" "${common[@]}" trainer.n_gpus_per_node=1 \
      trainer.default_local_dir="$dir" "$@" > "$dir.log" 2>&1
  else
    mpirun --allow-run-as-root --oversubscribe -np "$ranks" -x OMP_NUM_THREADS=1 "$verl" train \
      "$root/configs/demo.yaml" "${common[@]}" trainer.n_gpus_per_node="$ranks" trainer.default_local_dir="$dir" \
      "$@" > "$dir.log" 2>&1
  fi
}
# compare A B STEPS KEYS...: each step's metrics in A and B agree within 1e-4 relative (1e-7
# absolute for values near zero, e.g. PPO's pg_loss over whitened advantages).
compare() {
  python3 - "$@" <<'PY'
import json, sys
a, b, steps, keys = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split(",")], sys.argv[4:]
def rows(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        out[r["step"]] = {**out.get(r["step"], {}), **r}
    return out
ra, rb = rows(a + "/metrics.jsonl"), rows(b + "/metrics.jsonl")
bad = 0
for s in steps:
    for k in keys:
        x, y = ra[s][k], rb[s][k]
        if abs(x - y) > 1e-7 + 1e-4 * max(abs(x), abs(y)):
            print(f"step {s} {k}: {x} vs {y}"); bad += 1
sys.exit(1 if bad else 0)
PY
}
keys=(critic/score/mean response_length/mean actor/pg_loss actor/grad_norm actor/entropy perf/total_num_tokens)

# GRPO, 3 steps, validation and a checkpoint at the last one.
run 1 "$work/one" trainer.total_training_steps=3 trainer.test_freq=3 trainer.save_freq=3
check "one process runs" test $? -eq 0
run 2 "$work/two" trainer.total_training_steps=3 trainer.test_freq=3 trainer.save_freq=3
check "two ranks run" test $? -eq 0
check "GRPO metrics: 2 ranks = 1 process" compare "$work/one" "$work/two" 1,2,3 "${keys[@]}"
check "validation split over 2 ranks = 1 process" compare "$work/one" "$work/two" 3 "val-core/arith/reward/mean@1"
check "rank 0 alone writes the checkpoint" test -f "$work/two/global_step_3/actor/huggingface/model.safetensors"
echo '{"tokens": [510, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 300, 400, 500]}' > "$work/tokens.jsonl"
for r in one two; do
  "$verl" logprobs --model "$work/$r/global_step_3/actor/huggingface" --input "$work/tokens.jsonl" > "$work/$r.lp" 2>/dev/null
done
check "exported models' log-probs within 1e-5" python3 -c "
import json
a, b = (json.loads(open('$work/' + r + '.lp').read())['logprobs'] for r in ('one', 'two'))
assert len(a) == len(b) == 13 and max(abs(x - y) for x, y in zip(a, b)) <= 1e-5, (a, b)"

# What crosses ranks besides the gradients: the advantage stage's per-token rows (perf/exchange_bytes,
# rank 0's share), a few bytes per token of its samples, never a hidden- or vocabulary-size tensor.
check "experience exchange is a few bytes a token" python3 -c "
import json
rows = [json.loads(l) for l in open('$work/two/metrics.jsonl')]
rows = [r for r in rows if 'perf/exchange_bytes' in r]
assert len(rows) == 3, rows
for r in rows:
    tokens = r['perf/total_num_tokens'] / 2  # rank 0's half of the global batch
    assert 0 < r['perf/exchange_bytes'] <= 16 * tokens, (r['perf/exchange_bytes'], tokens)
one = [json.loads(l) for l in open('$work/one/metrics.jsonl')]
assert all(r.get('perf/exchange_bytes', 0) == 0 for r in one)  # one process moves nothing"

# ZeRO-1: each rank keeps half of the AdamW moments; the steps and the saved checkpoint are the
# one-process run's, and the checkpoint (moments gathered) resumes at one rank.
run 2 "$work/zero1" trainer.total_training_steps=2 trainer.test_freq=-1 trainer.save_freq=2 \
  actor_rollout_ref.actor.zero_stage=1
check "ZeRO-1 runs" test $? -eq 0
check "ZeRO-1 metrics: 2 ranks = 1 process" compare "$work/one" "$work/zero1" 1,2 "${keys[@]}"
check "ZeRO-1 shards the moments" grep -q "ZeRO-1 (actor_rollout_ref.actor.zero_stage): rank 1 of 2 keeps the AdamW moments of elements" "$work/zero1.log"
# Saved after step 1 (moments gathered from both ranks), resumed at one rank: steps 2 and 3 need
# those moments (step 2's update) to equal the uninterrupted run's.
run 2 "$work/zero1_ckpt" trainer.total_training_steps=1 trainer.test_freq=-1 trainer.save_freq=1 \
  actor_rollout_ref.actor.zero_stage=1
run 1 "$work/one_step1" trainer.total_training_steps=1 trainer.test_freq=-1 trainer.save_freq=1
check "ZeRO-1's gathered AdamW moments = one process's" python3 - "$work/one_step1" "$work/zero1_ckpt" <<'PY'
import json, struct, sys
def tensors(d):
    raw = open(d + "/global_step_1/actor/optim.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
    return out
x, y = tensors(sys.argv[1]), tensors(sys.argv[2])
assert x.keys() == y.keys() and x, (x.keys(), y.keys())
assert all(len(x[k]) == len(y[k]) for k in x)
for k in x:  # each element within 1e-4 of the tensor's largest (float summation order differs)
    scale = max(abs(p) for p in x[k])
    worst = max(abs(p - q) for p, q in zip(x[k], y[k]))
    assert scale > 0 and worst <= 1e-4 * scale, (k, worst, scale)
PY
run 1 "$work/zero1_ckpt" trainer.total_training_steps=3 trainer.save_freq=3 trainer.test_freq=-1
check "a ZeRO-1 checkpoint resumes at 1 rank" compare "$work/one" "$work/zero1_ckpt" 2,3 "${keys[@]}"

# PPO with a critic (GAE), 2 steps.
ppo=(algorithm.adv_estimator=gae critic.model.path="$root/assets/demo/model" critic.ppo_mini_batch_size=16
  trainer.total_training_steps=2 trainer.test_freq=-1 trainer.save_freq=-1)
run 1 "$work/ppo_one" "${ppo[@]}"
run 2 "$work/ppo_two" "${ppo[@]}"
check "PPO metrics: 2 ranks = 1 process" compare "$work/ppo_one" "$work/ppo_two" 1,2 "${keys[@]}" critic/vf_loss critic/grad_norm
run 2 "$work/ppo_zero1" "${ppo[@]}" actor_rollout_ref.actor.zero_stage=1 critic.zero_stage=1
check "PPO with ZeRO-1 on actor and critic = 1 process" compare "$work/ppo_one" "$work/ppo_zero1" 1,2 "${keys[@]}" critic/vf_loss critic/grad_norm

# Checkpoint at 2 ranks, resume at 1, and the reverse: step 3 as in the uninterrupted run.
run 2 "$work/ckpt_21" trainer.total_training_steps=2 trainer.save_freq=2 trainer.test_freq=-1
run 1 "$work/ckpt_21" trainer.total_training_steps=3 trainer.save_freq=3 trainer.test_freq=-1
check "saved at 2 ranks, resumed at 1" compare "$work/one" "$work/ckpt_21" 3 "${keys[@]}"
run 1 "$work/ckpt_12" trainer.total_training_steps=2 trainer.save_freq=2 trainer.test_freq=-1
run 2 "$work/ckpt_12" trainer.total_training_steps=3 trainer.save_freq=3 trainer.test_freq=-1
check "saved at 1 rank, resumed at 2" compare "$work/one" "$work/ckpt_12" 3 "${keys[@]}"

# Kill -9 rank 1 in step 2: the job ends non-zero, the dead rank is named, step 1's checkpoint resumes.
start=$(date +%s)
mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 sh -c \
  'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then export VERL_FAULT_INJECT=train:2; fi; exec "$0" "$@"' \
  "$verl" train "$root/configs/demo.yaml" "${common[@]}" trainer.n_gpus_per_node=2 trainer.total_training_steps=3 \
  trainer.save_freq=1 trainer.test_freq=-1 trainer.default_local_dir="$work/kill" > "$work/kill.log" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
check "a killed rank ends the job (rc $rc)" test "$rc" -ne 0
check "within nccl_timeout + 10 s ($elapsed s)" test "$elapsed" -le 70
check "the dead rank is named" grep -q "rank 1" "$work/kill.log"
check "step 1's checkpoint is intact" test -f "$work/kill/global_step_1/actor/huggingface/model.safetensors"
run 2 "$work/kill" trainer.total_training_steps=3 trainer.save_freq=3 trainer.test_freq=-1
check "the killed run resumes to the end" compare "$work/one" "$work/kill" 2,3 "${keys[@]}"

# A launcher that disagrees with the config.
mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$verl" train "$root/configs/demo.yaml" \
  "${common[@]}" trainer.n_gpus_per_node=8 trainer.default_local_dir="$work/bad" > "$work/bad.log" 2>&1
check "a wrong rank count fails" test $? -ne 0
check "the error names both keys" grep -q "trainer.nnodes (1) x trainer.n_gpus_per_node (8) = 8 ranks, but the launcher started 2" "$work/bad.log"

echo "data_parallel: $pass passed, $fail failed"
test "$fail" -eq 0
