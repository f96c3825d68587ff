#!/usr/bin/env bash
# LoRA training on the CPU (issue 39, docs/lora.md). GRPO on the demo with lora_rank=16 learns:
# greedy validation reward up by at least 0.25 in 15 steps. Its checkpoint holds the adapters only;
# `verl export` writes them as a PEFT directory and `--merge` as an HF model whose log-probs are
# base + adapter (`verl logprobs --lora`) within 1e-4. `mpirun -np 2` with LoRA equals one process
# with the same global batch within 1e-4 (per-step metrics and the exported adapters' log-probs),
# with ZeRO-2 over the adapter state too, and logs the adapters' gradient bytes. `verl sft` with
# model.lora_rank trains adapters and resumes from them.
# Usage: lora.sh VERL_BINARY REPO_ROOT WORK_DIR
set -uo pipefail
verl=$1 root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=tests/e2e/lib.sh
. "$root/tests/e2e/lib.sh"
demo=$root/assets/demo/model
lora=(actor_rollout_ref.model.lora_rank=16 actor_rollout_ref.model.lora_alpha=32
  actor_rollout_ref.actor.optim.lr=1e-3)

# metric DIR STEP KEY: the value a metrics.jsonl holds for KEY at STEP.
metric() {
  python3 -c "
import json, sys
v = [json.loads(l).get('$3') for l in open('$1/metrics.jsonl') if json.loads(l)['step'] == $2]
print(next(x for x in v if x is not None))"
}

# ---- GRPO with LoRA learns (the demo's settings, 15 steps, validation before and after)
(cd "$root" && OMP_NUM_THREADS=2 "$verl" train configs/demo.yaml "${lora[@]}" trainer.total_training_steps=15 \
  trainer.test_freq=15 trainer.save_freq=15 trainer.logger=[jsonl] trainer.default_local_dir="$work/learn" \
  > "$work/learn.log" 2>&1)
check "GRPO with LoRA runs" test $? -eq 0
before=$(metric "$work/learn" 0 val-core/arith/reward/mean@1)
after=$(metric "$work/learn" 15 val-core/arith/reward/mean@1)
echo "validation reward: $before before training, $after after 15 steps"
check "validation reward up by at least 0.25 ($before -> $after)" \
  python3 -c "import sys; sys.exit(0 if $after - $before >= 0.25 else 1)"
check "the log says the reference is the actor without adapters or that none is used" \
  grep -q "LoRA: rank 16, alpha 32 (scale 2), 28 adapted projections" "$work/learn.log"
ck=$work/learn/global_step_15
check "the checkpoint holds the adapters" test -f "$ck/actor/lora_adapter/adapter_model.safetensors"
check "the checkpoint holds no base weights" test ! -e "$ck/actor/huggingface"

# ---- export: PEFT directory and --merge
"$verl" export "$ck" "$work/peft" > /dev/null 2>&1
check "export writes a PEFT adapter directory" test -f "$work/peft/adapter_config.json" -a -f "$work/peft/adapter_model.safetensors"
check "adapter_config.json is PEFT's" python3 -c "
import json; c = json.load(open('$work/peft/adapter_config.json'))
assert c['peft_type'] == 'LORA' and c['r'] == 16 and c['lora_alpha'] == 32, c"
"$verl" export "$ck" "$work/merged" --merge > /dev/null 2>&1
check "export --merge writes an HF model" test -f "$work/merged/model.safetensors" -a -f "$work/merged/tokenizer.json"
echo '{"tokens": [510, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 300, 400, 500]}' > "$work/tokens.jsonl"
# logprobs OUT ARGS...: `verl logprobs` of the 14-token sequence.
logprobs() {
  local out=$1
  shift
  "$verl" logprobs "$@" --input "$work/tokens.jsonl" > "$out" 2> /dev/null
}
# close A B TOL: two log-prob files agree within TOL.
close() {
  python3 -c "
import json
a, b = (json.loads(open(f).read())['logprobs'] for f in ('$1', '$2'))
d = max(abs(x - y) for x, y in zip(a, b))
assert len(a) == len(b) == 13 and d <= $3, (d, a, b)"
}
differ() {
  python3 -c "
import json
a, b = (json.loads(open(f).read())['logprobs'] for f in ('$1', '$2'))
assert max(abs(x - y) for x, y in zip(a, b)) > 1e-3"
}
logprobs "$work/lp_lora.json" --model "$demo" --lora "$work/peft"
logprobs "$work/lp_merged.json" --model "$work/merged"
logprobs "$work/lp_base.json" --model "$demo"
check "merged model = base + adapter within 1e-4" close "$work/lp_lora.json" "$work/lp_merged.json" 1e-4
check "the trained adapter changed the model" differ "$work/lp_lora.json" "$work/lp_base.json"

# ---- data parallel over the adapter state: 2 ranks = 1 process (16 prompts x 4 samples a step)
common=("${demo_dp[@]}" "${lora[@]}" actor_rollout_ref.actor.use_kl_loss=true)
keys=("${dp_keys[@]}" actor/kl_loss)
run 1 "$work/one" trainer.total_training_steps=2 trainer.save_freq=2
check "LoRA, one process runs" test $? -eq 0
run 2 "$work/two" trainer.total_training_steps=2 trainer.save_freq=2
check "LoRA, two ranks run" test $? -eq 0
check "LoRA GRPO metrics: 2 ranks = 1 process" compare "$work/one" "$work/two" 1,2 "${keys[@]}"
check "the adapters' gradient bytes are logged" python3 -c "
import json
r = [json.loads(l) for l in open('$work/two/metrics.jsonl')]
assert all(0 < x['perf/grad_sync_bytes'] < 4 * 2 * 155648 * 2 for x in r), [x.get('perf/grad_sync_bytes') for x in r]"
"$verl" export "$work/one/global_step_2" "$work/peft_one" > /dev/null 2>&1
"$verl" export "$work/two/global_step_2" "$work/peft_two" > /dev/null 2>&1
logprobs "$work/lp_one.json" --model "$demo" --lora "$work/peft_one"
logprobs "$work/lp_two.json" --model "$demo" --lora "$work/peft_two"
check "exported adapters: 2 ranks = 1 process within 1e-4" close "$work/lp_one.json" "$work/lp_two.json" 1e-4
run 2 "$work/zero2" trainer.total_training_steps=2 actor_rollout_ref.actor.zero_stage=2
check "LoRA with ZeRO-2: 2 ranks = 1 process" compare "$work/one" "$work/zero2" 1,2 "${keys[@]}"
run 2 "$work/zero3" trainer.total_training_steps=1 actor_rollout_ref.actor.zero_stage=3
check "LoRA with ZeRO-3 is refused by name" grep -q "ZeRO-3 with LoRA: the adapters' master weights are not sharded" "$work/zero3.log"

# ---- SFT with LoRA: adapters train, the checkpoint is the merged model plus lora_adapter/, resume
sft=(model.partial_pretrain="$demo" model.lora_rank=8 model.lora_alpha=16 trainer.total_training_steps=2 trainer.save_freq=1
  trainer.logger=[jsonl] data.train_batch_size=16 trainer.default_local_dir="$work/sft")
(cd "$root" && OMP_NUM_THREADS=2 "$verl" sft configs/demo/sft.yaml "${sft[@]}" trainer.total_training_steps=1 > "$work/sft1.log" 2>&1)
check "sft with LoRA runs" test $? -eq 0
check "sft checkpoint holds the adapters" test -f "$work/sft/global_step_1/lora_adapter/adapter_config.json"
(cd "$root" && OMP_NUM_THREADS=2 "$verl" sft configs/demo/sft.yaml "${sft[@]}" > "$work/sft2.log" 2>&1)
check "sft with LoRA resumes" grep -q "resuming the LoRA adapters from $work/sft/global_step_1" "$work/sft2.log"
logprobs "$work/lp_sft_merged.json" --model "$work/sft/global_step_2"
logprobs "$work/lp_sft_lora.json" --model "$demo" --lora "$work/sft/global_step_2/lora_adapter"
check "sft checkpoint's merged model = base + its adapter within 1e-4" close "$work/lp_sft_merged.json" "$work/lp_sft_lora.json" 1e-4

# ---- verl's LoRA scripts (tests/fixtures/verl_scripts): the GRPO one trains 2 steps on the demo model
# with sizes shrunk by overrides after the script's; DAPO 7B's LoRA keys load (with its
# override_config.max_position_embeddings).
scripts=$root/tests/fixtures/verl_scripts
script_args() {  # script_args FIXTURE: the fixture's overrides with the paths filled in
  grep -v '^#' "$1" | sed "s|@DATA@|$root/assets/demo/train.jsonl|; s|@MODEL@|$demo|; s|@SAVE_DIR@|$work/verl_scripts/$(basename "$1" .txt)|"
}
shrink=(data.train_files="[$root/assets/demo/train.jsonl]" data.val_files="[$root/assets/demo/val.jsonl]"
  data.train_batch_size=4 data.max_prompt_length=32 data.max_response_length=24
  actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.rollout.n=2 trainer.total_training_steps=2
  trainer.device=cpu trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.val_before_train=false
  trainer.test_freq=-1 trainer.save_freq=2 trainer.logger=[jsonl])
for name in tuning__lora__run_qwen3_8b_fsdp apr2026__grpo_trainer__run_qwen2_5-3b_gsm8k_grpo_lora; do
  mapfile -t args < <(script_args "$scripts/$name.txt")
  out=$work/verl_scripts/$name
  (cd "$root" && "$verl" train "${args[@]}" "${shrink[@]}" trainer.default_local_dir="$out" > "$work/$name.log" 2>&1)
  check "verl script $name trains 2 steps with LoRA rank 64" python3 -c "
import json
rows = [json.loads(l) for l in open('$out/metrics.jsonl')]
assert [r['step'] for r in rows] == [1, 2], rows
assert all(0.0 <= r['critic/score/mean'] <= 1.0 and 'actor/kl_loss' in r for r in rows), rows
c = json.load(open('$out/global_step_2/actor/lora_adapter/adapter_config.json'))
assert c['r'] == 64 and c['lora_alpha'] == 32, c"
done
mapfile -t args < <(script_args "$scripts/dapo__test_dapo_7b_math_lora.txt")
"$verl" config "${args[@]}" > "$work/dapo_lora.yaml" 2> /dev/null
check "DAPO 7B's LoRA keys load (lora_rank 8)" grep -q "lora_rank: 8" "$work/dapo_lora.yaml"

echo "lora: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
