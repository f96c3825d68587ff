#!/usr/bin/env bash
# Kill -9 a GRPO run in the middle of a step and, in another run, in the middle of a checkpoint
# save; resume each with resume_mode=auto and check that the following steps' metrics equal an
# uninterrupted run's. Usage: resume_after_kill.sh VERL_BINARY REPO_ROOT WORK_DIR
set -euo pipefail
verl=$1 root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
common=(actor_rollout_ref.model.path="$root/assets/demo/model" data.train_files="[$root/assets/demo/train.jsonl]"
  data.val_files=null data.train_batch_size=4 actor_rollout_ref.actor.ppo_mini_batch_size=2
  actor_rollout_ref.rollout.n=2 trainer.total_training_steps=6 trainer.save_freq=2 trainer.logger=[jsonl])
run() { OMP_NUM_THREADS=1 "$verl" train "$root/configs/demo.yaml" "${common[@]}" trainer.default_local_dir="$1" > "$1.log" 2>&1; }

run "$work/full"
# Killed during training (step 5, after the save at 4) and during the save of step 4.
for point in train:5 save:4; do
  dir="$work/${point/:/_}"
  if VERL_FAULT_INJECT=$point run "$dir"; then echo "FAIL: the run with $point was not killed"; exit 1; fi
  echo "killed at $point; checkpoints: $(ls "$dir" | tr '\n' ' ')"
  run "$dir"  # resume_mode=auto is the default
done
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def last_per_step(path):
    rows = {}
    for line in open(path):
        r = json.loads(line)
        rows[r["step"]] = r  # after a resume the re-run steps replace the killed run's lines
    return rows
full = last_per_step(f"{work}/full/metrics.jsonl")
keys = ["critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy", "response_length/mean"]
bad = 0
for name in ["train_5", "save_4"]:
    got = last_per_step(f"{work}/{name}/metrics.jsonl")
    assert sorted(got) == sorted(full), (name, sorted(got))
    for step in sorted(full):
        for k in keys:
            if got[step][k] != full[step][k]:
                print(f"FAIL {name} step {step} {k}: {got[step][k]} != {full[step][k]}"); bad += 1
print("checked", len(full), "steps x 2 interrupted runs:", "1 passed, 0 failed" if bad == 0 else "0 passed, 1 failed")
sys.exit(1 if bad else 0)
PY
