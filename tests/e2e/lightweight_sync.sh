#!/usr/bin/env bash
# LightweightSync (trainer.gradient_sync_method=lightweight, docs/lightweight_sync.md) on the CPU
# with 2 MPI ranks on the demo task:
#  - 30 steps with top_k=0.05 int8 send at least 20x fewer gradient bytes than the dense all-reduce
#    (perf/grad_sync_bytes against perf/grad_sync_bytes_dense), and the greedy validation reward at
#    step 30 is >= 0.25 and within 0.1 of the dense run's; the same without error feedback is
#    printed (what it costs);
#  - top_k=1.0 in fp32 equals the dense run (3 steps, 1e-4 relative), also with ZeRO-1;
#  - sync_interval_steps=2: updates on even steps only, a checkpoint between syncs (the carry holds
#    the step's gradient) resumes to the same steps as the uninterrupted run;
#  - the critic syncs the same way (PPO), ZeRO-2 is refused by name, and ranks whose weights differ
#    after an update stop the run naming the rank.
# Usage: lightweight_sync.sh VERL_BINARY REPO_ROOT WORK_DIR
set -uo pipefail
verl=$1 root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=tests/e2e/lib.sh
. "$root/tests/e2e/lib.sh"
common=(actor_rollout_ref.model.path="$root/assets/demo/model" data.train_files="[$root/assets/demo/train.jsonl]"
  data.val_files="[$root/assets/demo/val.jsonl]" trainer.logger=[jsonl] trainer.val_before_train=false
  trainer.nnodes=1 trainer.n_gpus_per_node=2 actor_rollout_ref.nccl_timeout=120)
lw=(trainer.gradient_sync_method=lightweight)
# run DIR [overrides...]: the demo config under mpirun -np 2.
run() {
  local dir=$1
  shift
  mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$verl" train \
    "$root/configs/demo.yaml" "${common[@]}" trainer.default_local_dir="$dir" "$@" > "$dir.log" 2>&1
}
# metric DIR STEP KEY: the value logged at STEP.
metric() {
  python3 - "$@" <<'PY'
import json, sys
d, step, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
v = None
for line in open(d + "/metrics.jsonl"):
    r = json.loads(line)
    if r.get("step") == step and key in r:
        v = r[key]
print(v)
PY
}
keys=(critic/score/mean response_length/mean actor/pg_loss actor/grad_norm actor/entropy)

# 30 steps of the demo, dense and top 5% in int8 (with and without error feedback).
long=(trainer.total_training_steps=30 trainer.test_freq=30 trainer.save_freq=-1)
run "$work/dense" "${long[@]}"
check "dense run" test $? -eq 0
run "$work/lw" "${long[@]}" "${lw[@]}" trainer.lightweight_sync_config.top_k=0.05
check "lightweight run" test $? -eq 0
run "$work/lw_noef" "${long[@]}" "${lw[@]}" trainer.lightweight_sync_config.top_k=0.05 \
  trainer.lightweight_sync_config.error_feedback=false
check "lightweight run without error feedback" test $? -eq 0
check "lightweight: >= 20x fewer gradient bytes than dense; reward at step 30 >= 0.25 and within 0.1 of dense" \
  python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def rows(d):
    return [json.loads(l) for l in open(f"{work}/{d}/metrics.jsonl")]
def total(d, k):
    return sum(r.get(k, 0) for r in rows(d))
def reward(d):
    return [r for r in rows(d) if r.get("step") == 30 and "val-core/arith/reward/mean@1" in r][-1]["val-core/arith/reward/mean@1"]
sent, dense = total("lw", "perf/grad_sync_bytes"), total("lw", "perf/grad_sync_bytes_dense")
d_sent, d_dense = total("dense", "perf/grad_sync_bytes"), total("dense", "perf/grad_sync_bytes_dense")
r_dense, r_lw, r_noef = reward("dense"), reward("lw"), reward("lw_noef")
print(f"gradient bytes over 30 steps: dense {d_sent:.4g}, lightweight {sent:.4g} ({dense / sent:.1f}x fewer); "
      f"validation reward at step 30: dense {r_dense:.4f}, lightweight {r_lw:.4f}, without error feedback {r_noef:.4f}")
assert d_sent == d_dense > 0, (d_sent, d_dense)
assert abs(dense - d_dense) <= 1e-9 * d_dense, (dense, d_dense)
assert dense / sent >= 20, dense / sent
assert r_lw >= 0.25 and abs(r_lw - r_dense) <= 0.1, (r_lw, r_dense)
PY

# top_k = 1 in fp32: the dense run, also with ZeRO-1 (sharded moments beside the all-gather).
short=(trainer.total_training_steps=3 trainer.test_freq=-1 trainer.save_freq=-1 data.shuffle=false
  data.train_batch_size=16 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=16)
exact=("${lw[@]}" trainer.lightweight_sync_config.top_k=1.0 trainer.lightweight_sync_config.compression_dtype=fp32)
run "$work/dense3" "${short[@]}"
run "$work/exact" "${short[@]}" "${exact[@]}"
check "top_k=1 fp32 runs" test $? -eq 0
check "top_k=1 fp32 = dense" compare "$work/dense3" "$work/exact" 1,2,3 "${keys[@]}"
run "$work/exact_zero1" "${short[@]}" "${exact[@]}" actor_rollout_ref.actor.zero_stage=1
check "top_k=1 fp32 with ZeRO-1 = dense" compare "$work/dense3" "$work/exact_zero1" 1,2,3 "${keys[@]}"

# sync_interval_steps=2: steps 1 and 3 only keep their gradients (no bytes, no grad_norm); a
# checkpoint after step 1 (the carry holds its gradient) resumes to the uninterrupted steps 2-4.
interval=("${lw[@]}" trainer.lightweight_sync_config.top_k=0.05 trainer.lightweight_sync_config.sync_interval_steps=2
  trainer.test_freq=-1 data.shuffle=false data.train_batch_size=16 actor_rollout_ref.rollout.n=4
  actor_rollout_ref.actor.ppo_mini_batch_size=16)
run "$work/k2" "${interval[@]}" trainer.total_training_steps=4 trainer.save_freq=-1
check "interval 2 runs" test $? -eq 0
check "interval 2: no sync on steps 1 and 3, a sync on 2 and 4" python3 - "$work/k2" <<'PY'
import json, sys
rows = {}
for l in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(l)
    rows.setdefault(r["step"], {}).update(r)
for s in (1, 3):
    assert rows[s]["perf/grad_sync_bytes"] == 0 and "actor/grad_norm" not in rows[s], (s, rows[s])
for s in (2, 4):
    assert rows[s]["perf/grad_sync_bytes"] > 0 and rows[s]["actor/grad_norm"] > 0, (s, rows[s])
PY
mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x VERL_FAULT_INJECT=train:2 "$verl" train \
  "$root/configs/demo.yaml" "${common[@]}" "${interval[@]}" trainer.total_training_steps=4 trainer.save_freq=1 \
  trainer.default_local_dir="$work/k2_resume" > "$work/k2_resume.log" 2>&1
check "killed in step 2" test $? -ne 0
check "each rank saved its carry after step 1" test -f "$work/k2_resume/global_step_1/actor/sync_carry_world_size_2_rank_1.safetensors"
run "$work/k2_resume" "${interval[@]}" trainer.total_training_steps=4 trainer.save_freq=-1
check "resumed between syncs = uninterrupted" compare "$work/k2" "$work/k2_resume" 2,3,4 critic/score/mean actor/pg_loss
check "resumed between syncs: the same updates" compare "$work/k2" "$work/k2_resume" 2,4 actor/grad_norm

# PPO: the critic's gradients go the same way.
run "$work/ppo" "${short[@]}" "${lw[@]}" trainer.lightweight_sync_config.top_k=0.05 trainer.total_training_steps=2 \
  algorithm.adv_estimator=gae critic.model.path="$root/assets/demo/model" critic.ppo_mini_batch_size=16
check "PPO with a critic runs" test $? -eq 0
check "the critic is compressed too (>= 20x fewer bytes)" python3 - "$work/ppo" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
r = [r for r in rows if r.get("step") == 2 and "perf/grad_sync_bytes" in r][-1]
assert "critic/grad_norm" in r and r["perf/grad_sync_bytes_dense"] / r["perf/grad_sync_bytes"] >= 20, r
PY

# Refusals and the agreement check.
run "$work/zero2" "${short[@]}" "${lw[@]}" actor_rollout_ref.actor.zero_stage=2
check "ZeRO-2 refused" test $? -ne 0
check "ZeRO-2 refused by name" grep -q "gradient_sync_method=lightweight with actor_rollout_ref.actor.zero_stage=2" "$work/zero2.log"
mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x VERL_FAULT_INJECT=weights:2:perturb "$verl" \
  train "$root/configs/demo.yaml" "${common[@]}" "${short[@]}" "${lw[@]}" trainer.default_local_dir="$work/drift" \
  > "$work/drift.log" 2>&1
check "diverged weights stop the run" test $? -ne 0
check "the diverged rank is named" grep -q "after optimizer update 2 rank 1's weights differ from rank 0's" "$work/drift.log"

echo "lightweight_sync: $pass passed, $fail failed"
test "$fail" -eq 0
