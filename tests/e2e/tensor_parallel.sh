#!/usr/bin/env bash
# Tensor-parallel generation on CPU ranks (actor_rollout_ref.rollout.tensor_model_parallel_size):
# GRPO on the demo under `mpirun -np 4` as TP 2 x DP 2 (groups of two ranks generate their
# members' prompts together over a slice of the model each), with ZeRO-0 and ZeRO-3 (the slice is
# cut from the whole weights the reshard gathers), and under `-np 2` as TP 2 x DP 1, against one
# process with the same global batch: per-step metrics within 1e-4 relative, the exported model's
# log-probs within 1e-5; ReMax's greedy baseline; the layout in the metrics (parallel/rollout_tp,
# parallel/dp) and the log; TP 2 asked of one process runs TP 1 and says so; a size that does not
# divide the ranks or the model's heads is refused.
# Usage: tensor_parallel.sh VERL_BINARY REPO_ROOT WORK_DIR
set -uo pipefail
verl=$1 root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=tests/e2e/lib.sh
. "$root/tests/e2e/lib.sh"
common=("${demo_dp[@]}" actor_rollout_ref.actor.use_dynamic_bsz=false actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4)
keys=("${dp_keys[@]}")
steps=(trainer.total_training_steps=3 trainer.test_freq=3 trainer.save_freq=3)
tp2=(actor_rollout_ref.rollout.tensor_model_parallel_size=2)

run 1 "$work/one" "${steps[@]}" "${tp2[@]}"
check "one process runs" test $? -eq 0
check "one process asked for TP 2 runs TP 1 and says so" grep -q \
  "rollout layout: tensor parallel 1 x data parallel 1 over 1 rank(s) (actor_rollout_ref.rollout.tensor_model_parallel_size=2 with 1 rank(s): tensor parallel size 1 instead)" \
  "$work/one.log"
run 4 "$work/tp2dp2" "${steps[@]}" "${tp2[@]}"
check "TP 2 x DP 2 runs" test $? -eq 0
check "TP 2 x DP 2 metrics = one process's" compare "$work/one" "$work/tp2dp2" 1,2,3 "${keys[@]}"
check "TP 2 x DP 2 validation = one process's" compare "$work/one" "$work/tp2dp2" 3 "val-core/arith/reward/mean@1"
check "TP 2 x DP 2 is logged" grep -q "rollout layout: tensor parallel 2 x data parallel 2 over 4 rank(s)$" "$work/tp2dp2.log"
run 4 "$work/tp2z3" "${steps[@]}" "${tp2[@]}" actor_rollout_ref.actor.zero_stage=3
check "TP 2 x DP 2 with ZeRO-3 runs" test $? -eq 0
check "TP 2 x DP 2 with ZeRO-3 metrics = one process's" compare "$work/one" "$work/tp2z3" 1,2,3 "${keys[@]}"
run 2 "$work/tp2dp1" "${steps[@]}" "${tp2[@]}"
check "TP 2 x DP 1 runs" test $? -eq 0
check "TP 2 x DP 1 metrics = one process's" compare "$work/one" "$work/tp2dp1" 1,2,3 "${keys[@]}"
check "the layout is in every step's metrics" python3 - "$work" <<'PY'
import json, sys
want = {"one": (1, 1), "tp2dp2": (2, 2), "tp2z3": (2, 2), "tp2dp1": (2, 1)}
for run, (tp, dp) in want.items():
    rows = [json.loads(l) for l in open(f"{sys.argv[1]}/{run}/metrics.jsonl")]
    rows = [r for r in rows if "parallel/rollout_tp" in r]
    assert len(rows) == 3, (run, rows)
    assert all(r["parallel/rollout_tp"] == tp and r["parallel/dp"] == dp for r in rows), (run, rows)
PY
# ReMax's greedy baseline goes through the same tensor-parallel rollout.
remax=(algorithm.adv_estimator=remax trainer.total_training_steps=2 trainer.save_freq=-1 trainer.test_freq=-1)
run 1 "$work/remax1" "${remax[@]}"
run 4 "$work/remax4" "${remax[@]}" "${tp2[@]}"
check "ReMax at TP 2 x DP 2 = one process" compare "$work/remax1" "$work/remax4" 1,2 "${keys[@]}"

echo '{"tokens": [510, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 300, 400, 500]}' > "$work/tokens.jsonl"
for r in one tp2dp2 tp2z3 tp2dp1; do
  "$verl" logprobs --model "$work/$r/global_step_3/actor/huggingface" --input "$work/tokens.jsonl" > "$work/$r.lp" 2>/dev/null
done
check "exported models' log-probs within 1e-5 of one process's" python3 - "$work" <<'PY'
import json, sys
lp = {r: json.loads(open(f"{sys.argv[1]}/{r}.lp").read())["logprobs"] for r in ("one", "tp2dp2", "tp2z3", "tp2dp1")}
for r, v in lp.items():
    assert len(v) == 13 and max(abs(x - y) for x, y in zip(lp["one"], v)) <= 1e-5, (r, lp)
PY

# Three ranks cannot form groups of two.
run 3 "$work/three" trainer.total_training_steps=1 data.train_batch_size=12 \
  actor_rollout_ref.actor.ppo_mini_batch_size=12 "${tp2[@]}"
check "TP 2 over 3 ranks fails" test $? -ne 0
check "TP 2 over 3 ranks names the key" grep -q \
  "actor_rollout_ref.rollout.tensor_model_parallel_size=2 must divide the 3 ranks into whole generation groups" \
  "$work/three.log"
# The demo model's 2 kv heads do not split 4 ways: refused before the first step.
run 4 "$work/four" trainer.total_training_steps=1 actor_rollout_ref.rollout.tensor_model_parallel_size=4
check "TP 4 of 2 kv heads fails" test $? -ne 0
check "TP 4 of 2 kv heads names the key and the heads" grep -q \
  "actor_rollout_ref.rollout.tensor_model_parallel_size=4 must divide num_attention_heads (4) and num_key_value_heads (2)" \
  "$work/four.log"
check "TP 4 of 2 kv heads fails before a step" test ! -e "$work/four/metrics.jsonl"

echo "tensor_parallel: $pass passed, $fail failed"
test "$fail" -eq 0
