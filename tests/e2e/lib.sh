# Helpers shared by the e2e scripts (sourced; they set `pass` and `fail`).
pass=0 fail=0
# check WHAT COMMAND...: counts COMMAND's success, prints WHAT when it fails.
check() {
  local what=$1
  shift
  if "$@"; then pass=$((pass + 1)); else echo "FAIL: $what"; fail=$((fail + 1)); fi
}
# demo_reward_model DIR: a reward model of the demo's shape (Qwen2ForSequenceClassification, one
# label, random weights of seed 7) with the demo's tokenizer files, by the caller's $verl (needs
# $root); DIR.json holds its config.
demo_reward_model() {
  python3 - "$root/assets/demo/model/config.json" "$1.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["architectures"] = ["Qwen2ForSequenceClassification"]
c["num_labels"] = 1
json.dump(c, open(sys.argv[2], "w"))
PY
  "$verl" init-model --config "$1.json" --tokenizer "$root/assets/demo/model" --out "$1" --seed 7 > /dev/null 2>&1
}
# The data-parallel checks' demo run (needs $root): 16 prompts x 4 samples a step, no shuffling,
# the JSONL log, and the per-step metrics they compare.
demo_dp=(actor_rollout_ref.model.path="$root/assets/demo/model" data.train_files="[$root/assets/demo/train.jsonl]"
  data.val_files="[$root/assets/demo/val.jsonl]" data.shuffle=false data.train_batch_size=16
  actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=16 trainer.logger=[jsonl]
  trainer.val_before_train=false trainer.nnodes=1 actor_rollout_ref.nccl_timeout=60)
dp_keys=(critic/score/mean response_length/mean actor/pg_loss actor/grad_norm actor/entropy perf/total_num_tokens)
# run RANKS DIR [overrides...]: `verl train` of the demo config with the caller's $verl, $root and
# `common` overrides, on one process or under mpirun with RANKS ranks; the log goes to DIR.log.
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
# compare A B STEPS KEYS...: each step's metrics in A/metrics.jsonl and B/metrics.jsonl agree within
# 1e-4 relative (1e-7 absolute for values near zero, e.g. PPO's pg_loss over whitened advantages);
# a key missing on either side is a difference.
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
        x, y = ra.get(s, {}).get(k), rb.get(s, {}).get(k)
        if x is None or y is None or abs(x - y) > 1e-7 + 1e-4 * max(abs(x), abs(y)):
            print(f"step {s} {k}: {x} vs {y}"); bad += 1
sys.exit(1 if bad else 0)
PY
}
