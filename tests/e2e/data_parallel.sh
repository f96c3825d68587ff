#!/usr/bin/env bash
# Data parallel on the CPU: the demo config under `mpirun -np 2` against one process with the same
# global batch (16 prompts x 4 samples a step, no shuffling). Checks, per step, critic/score/mean,
# response_length/mean, actor/pg_loss and actor/grad_norm within 1e-4 relative and the exported
# model's log-probs within 1e-5; the same launched with torchrun-style variables (TCP, no MPI), with
# ZeRO-1 and ZeRO-2 (gradients reduced in buckets
# during backward), without balance_batch, for PPO with a critic (with ZeRO 0, 1 and 2) and with
# trainer.one_step_off_policy; a
# checkpoint saved at 2 ranks
# resumed at 1 and the reverse; kill -9 of one rank (the job ends, the dead rank is named, the last
# checkpoint resumes); a stuck rank (the other times out after nccl_timeout); a rank count that disagrees with trainer.nnodes x n_gpus_per_node;
# `verl sft` on two ranks against one process.
# Usage: data_parallel.sh VERL_BINARY REPO_ROOT WORK_DIR
set -uo pipefail
verl=$1 root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=tests/e2e/lib.sh
. "$root/tests/e2e/lib.sh"
common=("${demo_dp[@]}")
keys=("${dp_keys[@]}")

echo '{"tokens": [510, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 300, 400, 500]}' > "$work/tokens.jsonl"
# same_logprobs MODEL_A MODEL_B TOL: the two models' log-probs of one 14-token sequence within TOL.
same_logprobs() {
  "$verl" logprobs --model "$1" --input "$work/tokens.jsonl" > "$work/a.lp" 2>/dev/null &&
    "$verl" logprobs --model "$2" --input "$work/tokens.jsonl" > "$work/b.lp" 2>/dev/null &&
    python3 -c "
import json
a, b = (json.loads(open('$work/' + r + '.lp').read())['logprobs'] for r in ('a', 'b'))
assert len(a) == len(b) == 13 and max(abs(x - y) for x, y in zip(a, b)) <= $3, (a, b)"
}

# GRPO, 3 steps, validation and a checkpoint at the last one.
run 1 "$work/one" trainer.total_training_steps=3 trainer.test_freq=3 trainer.save_freq=3
check "one process runs" test $? -eq 0
run 2 "$work/two" trainer.total_training_steps=3 trainer.test_freq=3 trainer.save_freq=3
check "two ranks run" test $? -eq 0
check "GRPO metrics: 2 ranks = 1 process" compare "$work/one" "$work/two" 1,2,3 "${keys[@]}"
check "validation split over 2 ranks = 1 process" compare "$work/one" "$work/two" 3 "val-core/arith/reward/mean@1"
check "rank 0 alone writes the checkpoint" test -f "$work/two/global_step_3/actor/huggingface/model.safetensors"
check "exported models' log-probs within 1e-5" same_logprobs "$work/one/global_step_3/actor/huggingface" \
  "$work/two/global_step_3/actor/huggingface" 1e-5

# torchrun-style variables without MPI (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT):
# the TCP communicator, here with ZeRO-1; the same steps as one process.
port=$((20000 + $$ % 20000))
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 timeout 300 "$verl" train \
    "$root/configs/demo.yaml" "${common[@]}" trainer.n_gpus_per_node=2 trainer.default_local_dir="$work/tcp" \
    trainer.total_training_steps=3 trainer.test_freq=3 trainer.save_freq=-1 actor_rollout_ref.actor.zero_stage=1 \
    > "$work/tcp.$r.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
check "torchrun-style launch runs over TCP" test "$rc" -eq 0
check "torchrun-style launch: 2 ranks = 1 process" compare "$work/one" "$work/tcp" 1,2,3 "${keys[@]}"
check "torchrun-style validation = 1 process" compare "$work/one" "$work/tcp" 3 "val-core/arith/reward/mean@1"

# What crosses ranks besides the gradients: balance_batch's rows (token ids, rollout log-probs, mask,
# token scores) and the advantage stage's per-token rows (perf/exchange_bytes, rank 0's share), a
# few bytes per token of its samples, never a hidden- or vocabulary-size tensor (the demo model's
# hidden size is 64 and its vocabulary 1000: one such row a token would be >= 256 bytes).
check "experience exchange is a few bytes a token" python3 -c "
import json
rows = [json.loads(l) for l in open('$work/two/metrics.jsonl')]
rows = [r for r in rows if 'perf/exchange_bytes' in r]
assert len(rows) == 3, rows
for r in rows:
    tokens = r['perf/total_num_tokens'] / 2  # rank 0's half of the global batch
    assert 0 < r['perf/exchange_bytes'] <= 32 * tokens, (r['perf/exchange_bytes'], tokens)
one = [json.loads(l) for l in open('$work/one/metrics.jsonl')]
assert all(r.get('perf/exchange_bytes', 0) == 0 for r in one)  # one process moves nothing"
# balance_batch: verl's global_seqlen/* before and after; the balanced spread is never wider.
check "balance_batch evens the ranks' tokens" python3 -c "
import json
rows = [json.loads(l) for l in open('$work/two/metrics.jsonl')]
rows = [r for r in rows if 'global_seqlen/balanced_max' in r]
assert len(rows) == 3, rows
for r in rows:
    before = r['global_seqlen/max'] - r['global_seqlen/min']
    after = r['global_seqlen/balanced_max'] - r['global_seqlen/balanced_min']
    assert 0 <= after <= before and r['global_seqlen/balanced_max'] <= r['global_seqlen/max'], r"
# Gradient sync: every step reports the bytes this rank sent (a dense ring all-reduce of the demo
# model's fp32 gradients: 2 (W-1)/W x 4 bytes x parameters) and the seconds backward did not hide.
check "grad sync bytes = a ring all-reduce of the gradients" python3 -c "
import json, struct
raw = open('$root/assets/demo/model/model.safetensors', 'rb').read()
head = json.loads(raw[8:8 + struct.unpack('<Q', raw[:8])[0]])
params = sum(eval('*'.join(map(str, v['shape'])) or '1') for k, v in head.items() if k != '__metadata__')
rows = [json.loads(l) for l in open('$work/two/metrics.jsonl')]
rows = [r for r in rows if 'perf/grad_sync_bytes' in r]
assert len(rows) == 3, rows
for r in rows:
    assert abs(r['perf/grad_sync_bytes'] - 4.0 * params) <= 4 * 64, (r['perf/grad_sync_bytes'], params)
    assert r['timing_s/grad_sync'] >= 0
one = [json.loads(l) for l in open('$work/one/metrics.jsonl')]
assert all('perf/grad_sync_bytes' not in r for r in one)"
run 2 "$work/unbalanced" trainer.total_training_steps=2 trainer.test_freq=-1 trainer.save_freq=-1 trainer.balance_batch=false
check "without balance_batch: 2 ranks = 1 process" compare "$work/one" "$work/unbalanced" 1,2 "${keys[@]}"
check "without balance_batch: no global_seqlen" bash -c "! grep -q global_seqlen '$work/unbalanced/metrics.jsonl'"

# ZeRO-1: each rank keeps half of the AdamW moments; the steps and the saved checkpoint are the
# one-process run's, and the checkpoint (moments gathered) resumes at one rank.
run 2 "$work/zero1" trainer.total_training_steps=2 trainer.test_freq=-1 trainer.save_freq=2 \
  actor_rollout_ref.actor.zero_stage=1
check "ZeRO-1 runs" test $? -eq 0
check "ZeRO-1 metrics: 2 ranks = 1 process" compare "$work/one" "$work/zero1" 1,2 "${keys[@]}"
check "ZeRO-1 shards the moments" grep -q "ZeRO-1 (actor_rollout_ref.actor.zero_stage): rank 1 of 2 keeps the AdamW moments of elements" "$work/zero1.log"
# Saved after step 1: each rank writes its own slice of the moments in parallel
# (optim_world_size_2_rank_R.safetensors, no gather); the slices put together equal the one-process
# run's whole moments, and the checkpoint resumes at one rank (resharded on load): steps 2 and 3 need
# those moments (step 2's update) to equal the uninterrupted run's.
run 2 "$work/zero1_ckpt" trainer.total_training_steps=1 trainer.test_freq=-1 trainer.save_freq=1 \
  actor_rollout_ref.actor.zero_stage=1
run 1 "$work/one_step1" trainer.total_training_steps=1 trainer.test_freq=-1 trainer.save_freq=1
check "ZeRO-1's per-rank moment shards = one process's moments" python3 - "$work/one_step1" "$work/zero1_ckpt" <<'PY'
import json, os, struct, sys
def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
    return out, head.get("__metadata__", {})
x, _ = read(sys.argv[1] + "/global_step_1/actor/optim.safetensors")
d = sys.argv[2] + "/global_step_1/actor"
assert not os.path.exists(d + "/optim.safetensors"), "the sharded run gathered its moments"
y, ends = {}, []
for r in range(2):
    t, meta = read(d + "/optim_world_size_2_rank_%d.safetensors" % r)
    assert int(meta["begin"]) == (ends[-1] if ends else 0), meta
    ends.append(int(meta["end"]))
    for k in t:
        y[k] = y.get(k, ()) + t[k]
assert x.keys() == y.keys() and x, (x.keys(), y.keys())
assert all(len(x[k]) == len(y[k]) == ends[-1] for k in x)
for k in x:  # each element within 1e-4 of the tensor's largest (float summation order differs)
    scale = max(abs(p) for p in x[k])
    worst = max(abs(p - q) for p, q in zip(x[k], y[k]))
    assert scale > 0 and worst <= 1e-4 * scale, (k, worst, scale)
PY
cp -r "$work/zero1_ckpt" "$work/zero1_to_zero2"
run 2 "$work/zero1_to_zero2" trainer.total_training_steps=3 trainer.save_freq=-1 trainer.test_freq=-1 \
  actor_rollout_ref.actor.zero_stage=2
check "ZeRO-1 shards resume at 2 ranks with ZeRO-2" compare "$work/one" "$work/zero1_to_zero2" 2,3 "${keys[@]}"
run 1 "$work/zero1_ckpt" trainer.total_training_steps=3 trainer.save_freq=3 trainer.test_freq=-1
check "a ZeRO-1 checkpoint resumes at 1 rank" compare "$work/one" "$work/zero1_ckpt" 2,3 "${keys[@]}"

# ZeRO-2: each rank keeps only its shard of the gradients. With micro-batches of 4 samples (no
# dynamic sizes: 8 a rank) every micro-batch's buckets are reduced to their owners, so a step sends
# 8 times ZeRO-1's gradient bytes. Checked against one process with the same micro-batches; a
# checkpoint saved after step 1 resumes at one rank.
micro=(actor_rollout_ref.actor.use_dynamic_bsz=false actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4)
run 1 "$work/one_micro" trainer.total_training_steps=2 trainer.test_freq=-1 trainer.save_freq=-1 "${micro[@]}"
run 2 "$work/zero2" trainer.total_training_steps=2 trainer.test_freq=-1 trainer.save_freq=-1 "${micro[@]}" \
  actor_rollout_ref.actor.zero_stage=2
check "ZeRO-2 runs" test $? -eq 0
check "ZeRO-2 metrics: 2 ranks = 1 process" compare "$work/one_micro" "$work/zero2" 1,2 "${keys[@]}"
check "ZeRO-2 shards the gradients" grep -q "ZeRO-2 (actor_rollout_ref.actor.zero_stage): rank 1 of 2 keeps the AdamW moments and gradients of elements" "$work/zero2.log"
check "ZeRO-2 reduces every micro-batch" python3 -c "
import json
z1 = [json.loads(l) for l in open('$work/zero1/metrics.jsonl')]
z2 = [json.loads(l) for l in open('$work/zero2/metrics.jsonl')]
b1 = [r['perf/grad_sync_bytes'] for r in z1 if 'perf/grad_sync_bytes' in r]
b2 = [r['perf/grad_sync_bytes'] for r in z2 if 'perf/grad_sync_bytes' in r]
assert len(b1) == len(b2) == 2 and all(abs(b - 8 * a) <= 1e-6 * b for a, b in zip(b1, b2)), (b1, b2)"
run 2 "$work/zero2_ckpt" trainer.total_training_steps=1 trainer.test_freq=-1 trainer.save_freq=1 "${micro[@]}" \
  actor_rollout_ref.actor.zero_stage=2
run 1 "$work/zero2_ckpt" trainer.total_training_steps=2 trainer.test_freq=-1 trainer.save_freq=-1 "${micro[@]}"
check "a ZeRO-2 checkpoint resumes at 1 rank" compare "$work/one_micro" "$work/zero2_ckpt" 2 "${keys[@]}"

# PPO with a critic (GAE), 2 steps.
ppo=(algorithm.adv_estimator=gae critic.model.path="$root/assets/demo/model" critic.ppo_mini_batch_size=16
  trainer.total_training_steps=2 trainer.test_freq=-1 trainer.save_freq=-1)
run 1 "$work/ppo_one" "${ppo[@]}"
run 2 "$work/ppo_two" "${ppo[@]}"
check "PPO metrics: 2 ranks = 1 process" compare "$work/ppo_one" "$work/ppo_two" 1,2 "${keys[@]}" critic/vf_loss critic/grad_norm
run 2 "$work/ppo_zero1" "${ppo[@]}" actor_rollout_ref.actor.zero_stage=1 critic.zero_stage=1
check "PPO with ZeRO-1 on actor and critic = 1 process" compare "$work/ppo_one" "$work/ppo_zero1" 1,2 "${keys[@]}" critic/vf_loss critic/grad_norm
run 2 "$work/ppo_zero2" "${ppo[@]}" actor_rollout_ref.actor.zero_stage=2 critic.zero_stage=2
check "PPO with ZeRO-2 on actor and critic = 1 process" compare "$work/ppo_one" "$work/ppo_zero2" 1,2 "${keys[@]}" critic/vf_loss critic/grad_norm

# One-step-off policy (each step trains on the rollout the step before started from its weights,
# generated on a thread beside that step): 2 ranks = 1 process, staleness included.
osp=(trainer.one_step_off_policy=true trainer.total_training_steps=3 trainer.test_freq=-1 trainer.save_freq=-1)
run 1 "$work/osp_one" "${osp[@]}"
run 2 "$work/osp_two" "${osp[@]}"
check "one-step-off: 2 ranks = 1 process" compare "$work/osp_one" "$work/osp_two" 1,2,3 "${keys[@]}" rollout/staleness

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

# A stuck rank (SIGSTOP in step 2: alive, never answering): the other rank's collective times out
# after nccl_timeout (5 s here), it names its stage and the job ends; never a hang.
start=$(date +%s)
timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 sh -c \
  'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then export VERL_FAULT_INJECT=train:2:stop; fi; exec "$0" "$@"' \
  "$verl" train "$root/configs/demo.yaml" "${common[@]}" trainer.n_gpus_per_node=2 trainer.total_training_steps=3 \
  trainer.save_freq=1 trainer.test_freq=-1 trainer.default_local_dir="$work/stuck" actor_rollout_ref.nccl_timeout=5 \
  > "$work/stuck.log" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
check "a stuck rank ends the job (rc $rc)" test "$rc" -ne 0 -a "$rc" -ne 124
check "within nccl_timeout + 10 s ($elapsed s)" test "$elapsed" -le 15
check "the waiting rank names the timeout and the stage" grep -q "rank 0 of 2: .* in stage 'update_actor' did not complete within 5 s (actor_rollout_ref.nccl_timeout)" "$work/stuck.log"
check "step 1's checkpoint survives the stuck rank" test -f "$work/stuck/global_step_1/actor/huggingface/model.safetensors"

# data.dynamic_batch on two ranks under ZeRO-3 (weights gathered inside every forward, so the
# ranks must run as many micro-batches): samples under 34 tokens are dropped, a budget of one
# sequence gives one micro-batch per kept sample, and a rank with fewer kept samples than the other
# packs fillers. Nothing hangs, and one process gives the same losses.
dyn=(data.dynamic_batch.enable=true data.dynamic_batch.base_batch_size=1 data.dynamic_batch.min_sequence_length=34
  actor_rollout_ref.actor.zero_stage=3 trainer.total_training_steps=3 data.val_files=null)
run 1 "$work/dyn1" "${dyn[@]}"
check "dynamic_batch: one process runs" test $? -eq 0
run 2 "$work/dyn2" "${dyn[@]}"
check "dynamic_batch: two ranks under ZeRO-3 run" test $? -eq 0
check "dynamic_batch: a rank short of kept samples packed fillers" python3 -c "
import json, sys
rows = [json.loads(l) for l in open('$work/dyn2/metrics.jsonl')]
sys.exit(0 if len(rows) == 3 and any(r['dynamic_batch/filler_samples'] > 0 for r in rows) else 1)"
check "dynamic_batch: 2 ranks = 1 process" compare "$work/dyn1" "$work/dyn2" 1,2,3 "${keys[@]}" \
  dynamic_batch/dropped_samples

# A launcher that disagrees with the config.
mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$verl" train "$root/configs/demo.yaml" \
  "${common[@]}" trainer.n_gpus_per_node=8 trainer.default_local_dir="$work/bad" > "$work/bad.log" 2>&1
check "a wrong rank count fails" test $? -ne 0
check "the error names both keys" grep -q "trainer.nnodes (1) x trainer.n_gpus_per_node (8) = 8 ranks, but the launcher started 2" "$work/bad.log"

# verl sft on two ranks: each takes half of a step's 16 rows, the loss scaled by the whole batch's
# target count, so the steps equal one process's (validation split over the ranks too); rank 0
# saves; a batch the ranks cannot split evenly is an error naming the key.
sft_run() {
  local ranks=$1 dir=$2
  shift 2
  local args=(sft "$root/configs/demo/sft.yaml" model.partial_pretrain="$root/assets/demo/model"
    data.train_files="[$root/assets/demo/sft.jsonl]" data.val_files="[$root/assets/demo/sft.jsonl]"
    data.val_max_samples=24 data.train_batch_size=16 trainer.total_training_steps=4 trainer.test_freq=2
    trainer.logger=[jsonl] trainer.device=cpu trainer.n_gpus_per_node="$ranks" trainer.default_local_dir="$dir" "$@")
  if [ "$ranks" = 1 ]; then
    OMP_NUM_THREADS=1 "$verl" "${args[@]}" > "$dir.log" 2>&1
  else
    mpirun --allow-run-as-root --oversubscribe -np "$ranks" -x OMP_NUM_THREADS=1 ${VERL_FAULT_INJECT:+-x VERL_FAULT_INJECT} \
      "$verl" "${args[@]}" > "$dir.log" 2>&1
  fi
}
sft_run 1 "$work/sft1"
check "sft: one process runs" test $? -eq 0
sft_run 2 "$work/sft2"
check "sft: two ranks run" test $? -eq 0
check "sft: 2 ranks = 1 process" compare "$work/sft1" "$work/sft2" 1,2,3,4 train/loss train/grad_norm train/lr
check "sft: validation over 2 ranks = 1 process" compare "$work/sft1" "$work/sft2" 2,4 val/loss
check "sft: rank 0 alone saves, once" test "$(grep -c "saved $work/sft2/global_step_4" "$work/sft2.log")" -eq 1
check "sft: the saved models' log-probs within 1e-4" same_logprobs "$work/sft1/global_step_4" "$work/sft2/global_step_4" 1e-4
# Killed in step 3 on both ranks and resumed from step 2's checkpoint: the same bits as the
# uninterrupted two-rank run.
sft_run 2 "$work/sft_full2" trainer.save_freq=2 trainer.test_freq=-1
VERL_FAULT_INJECT=train:3 sft_run 2 "$work/sft_kill" trainer.save_freq=2 trainer.test_freq=-1
check "sft: the injected kill ends the job" test $? -ne 0
sft_run 2 "$work/sft_kill" trainer.save_freq=2 trainer.test_freq=-1
check "sft: the resumed job finishes" test $? -eq 0
check "sft: rank 0 alone says it resumes" test "$(grep -c "resuming from $work/sft_kill/global_step_2 (step 2)" "$work/sft_kill.log")" -eq 1
check "sft: resumed at 2 ranks = uninterrupted" cmp "$work/sft_full2/global_step_4/model.safetensors" \
  "$work/sft_kill/global_step_4/model.safetensors"
sft_run 2 "$work/sft_odd" data.train_batch_size=15
check "sft: an uneven batch fails" test $? -ne 0
check "sft: the error names the key" grep -q "data.train_batch_size=15 must be a multiple of the 2 data-parallel ranks" "$work/sft_odd.log"

echo "data_parallel: $pass passed, $fail failed"
test "$fail" -eq 0
