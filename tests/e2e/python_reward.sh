#!/usr/bin/env bash
# Python reward functions (custom_reward_function.path + name, verl's form): the demo's scorer
# written in Python (tests/fixtures/python_reward/arith_reward.py) gives the same scores, and so
# the same run, as the built-in one over 2 GRPO steps; a dict result's numbers are logged as
# reward_extra/* and feed GDPO's reward components; a raising function fails its rows, counted,
# and the run goes on; a missing function or file stops the run before the first step, named.
# Usage: python_reward.sh VERL_BINARY REPO_ROOT WORK_DIR
set -uo pipefail
verl=$1 root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=tests/e2e/lib.sh
. "$root/tests/e2e/lib.sh"
py="$root/tests/fixtures/python_reward/arith_reward.py"
common=(trainer.device=cpu data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8
  actor_rollout_ref.rollout.n=4 trainer.val_before_train=false trainer.save_freq=-1 trainer.test_freq=-1
  trainer.logger=[jsonl] trainer.total_training_steps=2 data.val_files=null data.shuffle=false)
train() {  # train NAME [overrides...]: the demo config from the repo root; log in NAME.log
  local name=$1
  shift
  (cd "$root" && OMP_NUM_THREADS=1 "$verl" train configs/demo.yaml "${common[@]}" \
    trainer.default_local_dir="$work/$name" "$@" > "$work/$name.log" 2>&1)
}

train builtin
check "built-in scorer run exits 0" test $? -eq 0
train python custom_reward_function.path="$py"
check "Python reward run exits 0" test $? -eq 0
check "the Python reward is announced" grep -q "arith_reward.py's compute_score() through python3" "$work/python.log"
check "Python scores equal the built-in scorer's, so the runs are equal" python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
load = lambda d: [json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl")]
a, b = load("builtin"), load("python")
assert len(a) == len(b) == 2, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("critic/score/mean", "critic/score/max", "response_length/mean", "actor/pg_loss", "actor/grad_norm"):
        assert x[k] == y[k], (k, x[k], y[k])
    assert y["reward/failed_rows"] == 0 and y["reward_extra/acc/mean"] == y["critic/score/mean"], y
print("critic/score/mean per step:", [x["critic/score/mean"] for x in a])
assert any(x["critic/score/mean"] > 0 for x in a), "every score is 0: the comparison shows nothing"
PY

train gdpo custom_reward_function.path="$py" custom_reward_function.name=compute_score_parts \
  algorithm.adv_estimator=gdpo "algorithm.gdpo_reward_keys=[acc,format]" "algorithm.gdpo_reward_weights=[1.0,0.5]" \
  reward.reward_manager.name=gdpo trainer.experiment_name=gdpo_e2e
check "GDPO with a dict reward exits 0" test $? -eq 0
check "GDPO's components are logged and train" python3 - "$work" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/gdpo/metrics.jsonl")]
assert len(rows) == 2, rows
for r in rows:
    assert 0 <= r["reward_extra/format/mean"] <= 1 and 0 <= r["reward_extra/acc/mean"] <= 1, r
    assert math.isfinite(r["actor/pg_loss"]) and math.isfinite(r["actor/grad_norm"]), r
    assert r["reward_extra/named/mean"] == 1.0, r  # the gdpo manager passed experiment_name
print("reward_extra/format/mean per step:", [r["reward_extra/format/mean"] for r in rows])
PY
train gdpo_nokey custom_reward_function.path="$py" algorithm.adv_estimator=gdpo "algorithm.gdpo_reward_keys=[format]"
check "a GDPO key the reward does not return stops the run" test $? -ne 0
check "... naming the key and what there is" grep -qF "algorithm.gdpo_reward_keys: 'format' is not among the numbers the reward function returned (acc)" "$work/gdpo_nokey.log"
train gdpo_rule algorithm.adv_estimator=gdpo "algorithm.gdpo_reward_keys=[acc]"
check "GDPO without a reward function is refused" grep -qF "algorithm.adv_estimator=gdpo reads its reward components (acc)" "$work/gdpo_rule.log"

# verl's straight-through KL loss (kl_loss_type=k3+) loads and trains with the Python reward.
train k3plus custom_reward_function.path="$py" actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_type=k3+
check "kl_loss_type=k3+ trains" python3 - "$work" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/k3plus/metrics.jsonl")]
assert len(rows) == 2 and rows[1]["actor/kl_loss"] > 0, [r.get("actor/kl_loss") for r in rows]
PY

train crash custom_reward_function.path="$py" custom_reward_function.name=crash_on_odd_index
check "a raising function's run goes on" test $? -eq 0
check "its rows fail by name" grep -qF "the reward function failed: ValueError: odd rows fail here" "$work/crash.log"
check "and are counted" python3 - "$work" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/crash/metrics.jsonl")]
assert len(rows) == 2 and all(r["reward/failed_rows"] > 0 for r in rows), [r.get("reward/failed_rows") for r in rows]
PY

train nofn custom_reward_function.path="$py" custom_reward_function.name=nope
check "a missing function exits 1" test $? -eq 1
check "... naming file and function" grep -qF "arith_reward.py has no function 'nope'" "$work/nofn.log"
train nofile custom_reward_function.path="$work/missing.py"
check "a missing file exits 1" grep -qF "custom_reward_function.path=$work/missing.py (function 'compute_score'): no such file" "$work/nofile.log"
train both custom_reward_function.path="$py" custom_reward_function.command=cat
check "path and command together are refused" grep -qF "custom_reward_function.command and custom_reward_function.path are both set" "$work/both.log"

echo "python_reward: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
