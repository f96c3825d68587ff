#!/usr/bin/env bash
# Kill -9 a GRPO run in the middle of a step and, in another run, in the middle of a checkpoint
# save; resume each with resume_mode=auto and check that the following steps' metrics equal an
# uninterrupted run's. The same for `verl sft`, whose final model must also be the same bits.
# Usage: resume_after_kill.sh VERL_BINARY REPO_ROOT WORK_DIR
set -euo pipefail
verl=$1 root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
common=(actor_rollout_ref.model.path="$root/assets/demo/model" data.train_files="[$root/assets/demo/train.jsonl]"
  data.val_files=null data.train_batch_size=4 actor_rollout_ref.actor.ppo_mini_batch_size=2
  actor_rollout_ref.rollout.n=2 trainer.total_training_steps=6 trainer.save_freq=2 trainer.logger=[jsonl])
run() { OMP_NUM_THREADS=1 "$verl" train "$root/configs/demo.yaml" "${common[@]}" trainer.default_local_dir="$1" "${@:2}" > "$1.log" 2>&1; }

# same_metrics FULL KEYS RUN...: each run's metrics.jsonl (the last line of each step: a resumed run's
# re-run steps replace the killed run's lines) equals FULL's at every step, on the comma-separated KEYS.
same_metrics() {
  python3 - "$@" <<'PY'
import json, sys
full_dir, keys, runs = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
def last_per_step(path):
    rows = {}
    for line in open(path):
        r = json.loads(line)
        rows[r["step"]] = r
    return rows
full = last_per_step(f"{full_dir}/metrics.jsonl")
bad = 0
for run in runs:
    got = last_per_step(f"{run}/metrics.jsonl")
    assert sorted(got) == sorted(full), (run, sorted(got))
    for step in sorted(full):
        for k in keys:
            if got[step][k] != full[step][k]:
                print(f"FAIL {run} step {step} {k}: {got[step][k]} != {full[step][k]}"); bad += 1
print(f"checked {len(full)} steps x {len(runs)} interrupted runs:", "1 passed, 0 failed" if bad == 0 else "0 passed, 1 failed")
sys.exit(1 if bad else 0)
PY
}


run "$work/full"
# Killed during training (step 5, after the save at 4) and during the save of step 4.
for point in train:5 save:4; do
  dir="$work/${point/:/_}"
  if VERL_FAULT_INJECT=$point run "$dir"; then echo "FAIL: the run with $point was not killed"; exit 1; fi
  echo "killed at $point; checkpoints: $(ls "$dir" | tr '\n' ' ')"
  run "$dir"  # resume_mode=auto is the default
done
same_metrics "$work/full" "critic/score/mean,actor/pg_loss,actor/grad_norm,actor/entropy,response_length/mean" \
  "$work/train_5" "$work/save_4"

# verl sft: 6 steps of 8 rows, a checkpoint every 2; killed in step 5 and in the save of step 4.
sft_run() {
  OMP_NUM_THREADS=1 "$verl" sft "$root/configs/demo/sft.yaml" model.partial_pretrain="$root/assets/demo/model" \
    data.train_files="[$root/assets/demo/sft.jsonl]" data.train_batch_size=8 data.shuffle=true \
    trainer.total_training_steps=6 trainer.save_freq=2 trainer.logger=[jsonl] trainer.default_local_dir="$1" "${@:2}" \
    > "$1.log" 2>&1
}
sft_run "$work/sft_full"
for point in train:5 save:4; do
  dir="$work/sft_${point/:/_}"
  if VERL_FAULT_INJECT=$point sft_run "$dir"; then echo "FAIL: the sft run with $point was not killed"; exit 1; fi
  echo "sft killed at $point; checkpoints: $(ls "$dir" | tr '\n' ' ')"
  sft_run "$dir"
  grep -q "resuming from $dir/global_step_[24] (step [24])" "$dir.log" || { echo "FAIL: $dir did not resume"; cat "$dir.log"; exit 1; }
  cmp "$work/sft_full/global_step_6/model.safetensors" "$dir/global_step_6/model.safetensors" ||
    { echo "FAIL: sft $point: the resumed run's final model differs from the uninterrupted run's"; exit 1; }
  cmp "$work/sft_full/global_step_6/optim.safetensors" "$dir/global_step_6/optim.safetensors" ||
    { echo "FAIL: sft $point: the resumed run's AdamW state differs"; exit 1; }
done
[ "$(grep -c . "$work/sft_full/metrics.jsonl")" -eq 6 ] || { echo "FAIL: the sft run logged $(grep -c . "$work/sft_full/metrics.jsonl") steps, not 6"; exit 1; }
same_metrics "$work/sft_full" "train/loss,train/grad_norm,train/lr" "$work/sft_train_5" "$work/sft_save_4"
# A finished run resumed again trains nothing; resume_mode=disable refuses a directory with checkpoints;
# a `verl train` checkpoint is not an SFT one; max_ckpt_to_keep keeps the newest.
sft_run "$work/sft_full"
grep -q "global_step_6 is at step 6 of 6: nothing left to train" "$work/sft_full.log" || { echo "FAIL: finished sft run"; cat "$work/sft_full.log"; exit 1; }
if sft_run "$work/sft_full" trainer.resume_mode=disable; then echo "FAIL: disable over checkpoints ran"; exit 1; fi
grep -q "trainer.resume_mode=disable starts a fresh run, but $work/sft_full already holds checkpoints (steps 2, 4, 6)" "$work/sft_full.log" ||
  { echo "FAIL: disable message"; cat "$work/sft_full.log"; exit 1; }
if sft_run "$work/sft_from_ppo" trainer.resume_mode=resume_path trainer.resume_from_path="$work/full/global_step_6"; then
  echo "FAIL: sft resumed from a verl train checkpoint"; exit 1; fi
grep -q "global_step_6: not a \`verl sft\` checkpoint" "$work/sft_from_ppo.log" || { echo "FAIL: ppo checkpoint message"; cat "$work/sft_from_ppo.log"; exit 1; }
sft_run "$work/sft_keep" trainer.max_ckpt_to_keep=2
[ "$(ls -d "$work"/sft_keep/global_step_* | xargs -n1 basename | tr '\n' ' ')" = "global_step_4 global_step_6 " ] ||
  { echo "FAIL: max_ckpt_to_keep=2 left $(ls "$work/sft_keep")"; exit 1; }
# checkpoint.save_contents without optimizer: no moments on disk, and the resume (load_contents
# follows save_contents) starts them fresh with a warning; asking to load them then names the cause;
# a list without the model is refused before training.
sft_run "$work/sft_lean" 'checkpoint.save_contents=[model,extra]' trainer.total_training_steps=2 trainer.save_freq=1
[ -f "$work/sft_lean/global_step_2/model.safetensors" ] && [ ! -e "$work/sft_lean/global_step_2/optim.safetensors" ] ||
  { echo "FAIL: save_contents without optimizer"; ls "$work/sft_lean/global_step_2"; exit 1; }
rm -r "$work/sft_lean/global_step_2" && echo 1 > "$work/sft_lean/latest_checkpointed_iteration.txt"
sft_run "$work/sft_lean" 'checkpoint.save_contents=[model,extra]' trainer.total_training_steps=2 trainer.save_freq=1
grep -q "global_step_1: checkpoint.load_contents leaves out the optimizer: AdamW's moments start fresh" "$work/sft_lean.log" ||
  { echo "FAIL: lean resume"; cat "$work/sft_lean.log"; exit 1; }
rm -r "$work/sft_lean/global_step_2" && echo 1 > "$work/sft_lean/latest_checkpointed_iteration.txt"
if sft_run "$work/sft_lean" trainer.total_training_steps=2; then echo "FAIL: loaded missing moments"; exit 1; fi
grep -q "saved without \"optimizer\" in checkpoint.save_contents" "$work/sft_lean.log" || { echo "FAIL: missing moments message"; cat "$work/sft_lean.log"; exit 1; }
if sft_run "$work/sft_nomodel" 'checkpoint.save_contents=[optimizer]'; then echo "FAIL: save_contents without the model ran"; exit 1; fi
grep -q "checkpoint.save_contents: a verl.cpp checkpoint is its model (an HF directory); include model or hf_model" "$work/sft_nomodel.log" ||
  { echo "FAIL: no-model message"; cat "$work/sft_nomodel.log"; exit 1; }
[ ! -e "$work/sft_nomodel/metrics.jsonl" ] || { echo "FAIL: trained before refusing save_contents"; exit 1; }
# verl train alike: the actor's moments left out of a checkpoint, and a resume that starts them fresh.
run "$work/ppo_lean" 'actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]' trainer.total_training_steps=2 trainer.save_freq=1 ||
  { echo "FAIL: lean verl train"; tail -3 "$work/ppo_lean.log"; exit 1; }
[ -f "$work/ppo_lean/global_step_2/actor/huggingface/model.safetensors" ] && [ ! -e "$work/ppo_lean/global_step_2/actor/optim.safetensors" ] ||
  { echo "FAIL: verl train save_contents without optimizer"; exit 1; }
run "$work/ppo_lean" 'actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]' trainer.total_training_steps=3 trainer.save_freq=1 ||
  { echo "FAIL: lean verl train resume"; tail -3 "$work/ppo_lean.log"; exit 1; }
grep -q "actor_rollout_ref.actor.checkpoint.load_contents leaves out the optimizer: AdamW's moments start fresh" "$work/ppo_lean.log" ||
  { echo "FAIL: verl train lean resume warning"; exit 1; }
echo "sft resume: finished run, disable, foreign checkpoint, retention and save_contents checked"
