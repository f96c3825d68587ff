#!/usr/bin/env bash
# Multi-turn rollouts with tools (issue 40): verl's GSM8K multi-turn example (its launch script's
# overrides, its gsm8k_multiturn_grpo.yaml and gsm8k_tool_config.yaml, tests/fixtures/
# verl_scripts/multiturn) loads with only its paths changed and trains 2 steps on the demo model,
# logging num_turns and the tool counts; a Python tool class in a tool config stops the run before
# the first step, named.
# Usage: multi_turn.sh VERL_BINARY REPO_ROOT WORK_DIR
set -uo pipefail
verl=$1 root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=tests/e2e/lib.sh
. "$root/tests/e2e/lib.sh"
fx=$root/tests/fixtures/verl_scripts/multiturn
script=$fx/sglang_multiturn__run_qwen2.5-3b_gsm8k_multiturn.txt
mapfile -t args < <(grep -v '^#' "$script" | sed "s|@CONFIG_DIR@|$fx/config|; s|@DATA@|$fx/gsm8k_multiturn_demo.jsonl|; s|@MODEL@|$root/assets/demo/model|")

"$verl" config "${args[@]}" > "$work/config.yaml" 2> "$work/config.err"
check "verl's GSM8K multi-turn script loads" test $? -eq 0
check "multi_turn.enable comes from gsm8k_multiturn_grpo.yaml" grep -A1 -q "^    multi_turn:" "$work/config.yaml"
check "its max_assistant_turns (5) is kept" grep -q "max_assistant_turns: 5" "$work/config.yaml"

# Sizes shrunk for the demo model (128 positions) by overrides appended after the script's.
shrink=(data.train_batch_size=4 data.max_prompt_length=48 data.max_response_length=64
  actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4
  actor_rollout_ref.rollout.n=2 trainer.total_training_steps=2 trainer.device=cpu trainer.n_gpus_per_node=1
  trainer.nnodes=1 trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 trainer.logger=[jsonl]
  trainer.default_local_dir="$work/gsm8k")
(cd "$work" && OMP_NUM_THREADS=1 "$verl" train "${args[@]}" "${shrink[@]}" > "$work/gsm8k.log" 2>&1)
check "the GSM8K tool run exits 0" test $? -eq 0
check "the tools are announced" grep -q "multi-turn rollouts: 1 tool(s) (calc_gsm8k_reward), rows without agent_name run tool_agent" "$work/gsm8k.log"
check "the GSM8K tool run trains 2 steps with the multi-turn metrics" python3 - "$work/gsm8k/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [1, 2], rows
for r in rows:
    for k in ("num_turns/min", "num_turns/max", "num_turns/mean", "tool_calls/count", "tool_calls/errors",
              "tool_calls/calc_gsm8k_reward/count", "tool_calls/calc_gsm8k_reward/latency_mean_s",
              "rollout/prefill_tokens_saved", "actor/pg_loss"):
        assert k in r, (k, sorted(r))
    assert 2 <= r["num_turns/min"] <= r["num_turns/mean"] <= r["num_turns/max"] <= 2 * 5, r
    assert 0.0 <= r["critic/score/mean"] <= 1.0, r
print("num_turns/mean", [r["num_turns/mean"] for r in rows], "tool calls", [r["tool_calls/count"] for r in rows])
PY

# A Python tool class is refused at start, by name, with what to use.
sed 's|verl.tools.gsm8k_tool.Gsm8kTool|verl.tools.search_tool.SearchTool|' "$fx/config/tool_config/gsm8k_tool_config.yaml" > "$work/py_tool.yaml"
(cd "$work" && "$verl" train "${args[@]}" "${shrink[@]}" actor_rollout_ref.rollout.multi_turn.tool_config_path="$work/py_tool.yaml" \
  trainer.default_local_dir="$work/py_tool" > "$work/py_tool.log" 2>&1)
check "a Python tool class stops the run" test $? -ne 0
check "the refusal names the class and the command tool" grep -q "class_name 'verl.tools.search_tool.SearchTool' is a Python tool class.*verl_cpp.command" "$work/py_tool.log"
check "no step ran" bash -c "! test -s '$work/py_tool/metrics.jsonl'"

echo "multi_turn: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
