# shellcheck shell=bash
# Sourced by the bench scripts that time `verl bench grpo-step` (the trainer's own step) on a model
# shape with random weights (bench/offload_cuda.sh, bench/overlap_cuda.sh). Expects $root (the
# repository), $verl and $python set by the caller.
: "${root:?set root to the repository before sourcing bench/grpo_lib.sh}"

# grpo_model SHAPE: the benchmark's data (out/grpo_bench: a tokenizer covering Qwen's vocabulary and
# ~256-token prompts) and a random-weight model of tests/fixtures/configs/SHAPE.json
# (out/models/SHAPE), each made once; prints the model's directory.
grpo_model() {
  local data=$root/out/grpo_bench model=$root/out/models/$1
  [ -f "$data/train.jsonl" ] || "$python" "$root/tools/bench/make_grpo_bench_data.py" "$data" >&2 || return 1
  if [ ! -f "$model/config.json" ]; then
    "$verl" init-model --config "$root/tests/fixtures/configs/$1.json" --tokenizer "$data/tokenizer" \
      --out "$model" >&2 || return 1
  fi
  echo "$model"
}

# grpo_reward_model SHAPE: a random-weight reward model (Qwen2ForSequenceClassification, one label)
# of tests/fixtures/configs/SHAPE.json with the benchmark's tokenizer (out/models/SHAPE-rm), made
# once; prints its directory.
grpo_reward_model() {
  local data=$root/out/grpo_bench model=$root/out/models/$1-rm
  grpo_model "$1" > /dev/null || return 1
  if [ ! -f "$model/config.json" ]; then
    local cfg
    cfg=$(mktemp --suffix=.json) || return 1
    "$python" - "$root/tests/fixtures/configs/$1.json" "$cfg" <<'PY' &&
import json, sys
c = json.load(open(sys.argv[1]))
c["architectures"] = ["Qwen2ForSequenceClassification"]
c["num_labels"] = 1
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
      "$verl" init-model --config "$cfg" --tokenizer "$data/tokenizer" --seed 7 --out "$model" >&2
    local rc=$?
    rm -f "$cfg"
    [ $rc -eq 0 ] || return 1
  fi
  echo "$model"
}

# grpo_run WORK NAME ARGS...: `verl bench grpo-step ARGS...` (run from the repository root); its
# JSON line goes to WORK/NAME.json and stdout, or, when it printed none, a line with the exit
# status and the first error line of WORK/NAME.err.
grpo_run() {
  local work=$1 name=$2
  shift 2
  (cd "$root" && "$verl" bench grpo-step "$@") > "$work/$name.out" 2> "$work/$name.err"
  local rc=$? line
  line=$(grep -m1 '^{"bench"' "$work/$name.out")
  if [ $rc -ne 0 ] || [ -z "$line" ]; then
    line="{\"bench\": \"grpo_step\", \"error\": \"exit $rc: $(grep -m1 -i 'error' "$work/$name.err" | tr -d '"\\' | cut -c1-400)\"}"
  fi
  echo "$line" > "$work/$name.json"
  echo "$line"
}
