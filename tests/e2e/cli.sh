#!/usr/bin/env bash
# The `verl` commands as a user runs them: outputs have the promised shape and bad input gets an
# error naming the line or key. Usage: cli.sh VERL_BINARY REPO_ROOT WORK_DIR
set -uo pipefail
verl=$1 root=$2 work=$3
umount "$work/ck_full" 2> /dev/null  # a tmpfs an interrupted run left mounted (the full-disk check)
rm -rf "$work" && mkdir -p "$work"
pass=0 fail=0
check() {  # check NAME COMMAND...: passes when the command exits 0
  if "${@:2}"; then pass=$((pass + 1)); else echo "FAIL: $1"; fail=$((fail + 1)); fi
}
golden=$root/tests/fixtures/golden/qwen2
demo=$root/assets/demo/model

# logprobs: n-1 log-probs (all <= 0) and entropies per line.
printf '{"tokens": [1, 2, 3, 4, 5]}\n{"tokens": [7, 8]}\n' | "$verl" logprobs --model "$golden" > "$work/lp.jsonl"
check "logprobs shape" python3 -c "
import json, sys
rows = [json.loads(l) for l in open('$work/lp.jsonl')]
assert [len(r['logprobs']) for r in rows] == [4, 1], rows
assert all(x <= 0 for r in rows for x in r['logprobs']) and all(e >= 0 for r in rows for e in r['entropy'])"
# A token outside the vocabulary names the line.
printf '{"tokens": [1, 2]}\n{"tokens": [1, 9999]}\n' | "$verl" logprobs --model "$golden" > /dev/null 2> "$work/err.txt"
check "logprobs bad id exits 1" test $? -eq 1
check "logprobs bad id names the line" grep -q "<stdin>:2: tokens\[1\] = 9999 is outside the vocabulary" "$work/err.txt"
# logprobs --lora: a PEFT adapter on its base gives PEFT's log-probs (tests/fixtures/lora).
lora=$root/tests/fixtures/lora/qwen2
python3 -c "
import json
for s in json.load(open('$golden/inputs.json'))['sequences']: print(json.dumps({'tokens': s}))" > "$work/lora_in.jsonl"
"$verl" logprobs --model "$golden" --lora "$lora" --input "$work/lora_in.jsonl" > "$work/lp_lora.jsonl"
check "logprobs --lora equals PEFT" python3 -c "
import json, struct
b = open('$lora/golden.safetensors', 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
def get(k):
    o0, o1 = h[k]['data_offsets']
    return struct.unpack('<%df' % ((o1 - o0) // 4), b[8 + n + o0:8 + n + o1])
rows = [json.loads(l) for l in open('$work/lp_lora.jsonl')]
assert len(rows) == 4 and all(len(r['logprobs']) == len(get('logprob.%d' % s)) for s, r in enumerate(rows))
err = max(abs(a - b) for s, r in enumerate(rows) for a, b in zip(r['logprobs'], get('logprob.%d' % s)))
assert err <= 1e-4, err"
# convert --lora writes the merged model, whose log-probs are the adapter's.
"$verl" convert --model "$golden" --lora "$lora" --out "$work/merged" 2> /dev/null
"$verl" logprobs --model "$work/merged" --input "$work/lora_in.jsonl" > "$work/lp_merged.jsonl"
check "convert --lora merges" python3 -c "
import json
a = [json.loads(l)['logprobs'] for l in open('$work/lp_lora.jsonl')]
b = [json.loads(l)['logprobs'] for l in open('$work/lp_merged.jsonl')]
assert len(a) == len(b) == 4 and max(abs(x - y) for r, s in zip(a, b) for x, y in zip(r, s)) <= 1e-4"
# generate --lora (merged) reports the log-probs that logprobs --lora (unmerged) gives its tokens.
echo '{"prompt_tokens": [1, 2, 3]}' > "$work/lora_prompt.jsonl"
"$verl" generate --model "$golden" --lora "$lora" --input "$work/lora_prompt.jsonl" --temperature 0 --max-tokens 5 --device cpu > "$work/gen_lora.jsonl"
python3 -c "
import json
r = json.loads(open('$work/gen_lora.jsonl').readline())
print(json.dumps({'tokens': [1, 2, 3] + r['response_tokens']}))" | "$verl" logprobs --model "$golden" --lora "$lora" > "$work/lp_gen_lora.jsonl"
check "generate --lora log-probs" python3 -c "
import json
g = json.loads(open('$work/gen_lora.jsonl').readline())['response_logprobs']
l = json.loads(open('$work/lp_gen_lora.jsonl').readline())['logprobs'][2:]
assert len(g) == len(l) == 5 and max(abs(x - y) for x, y in zip(g, l)) <= 1e-4, (g, l)"
# An adapter made for another model names the tensor and its file.
"$verl" logprobs --model "$golden" --lora "$root/tests/fixtures/lora/qwen3" --input "$work/lora_in.jsonl" > /dev/null 2> "$work/err_lora.txt"
check "logprobs --lora wrong base exits 1" test $? -eq 1
check "logprobs --lora wrong base names the file" grep -q "adapter_model.safetensors: tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight' has shape" "$work/err_lora.txt"

# generate: n samples per input line, in order, greedy decoding is deterministic.
printf '{"messages": [{"role": "user", "content": "What is 12 + 30?"}]}\n{"prompt_tokens": [510, 88, 89]}\n' > "$work/in.jsonl"
"$verl" generate --model "$demo" --input "$work/in.jsonl" --n 2 --temperature 0 --max-tokens 24 > "$work/gen1.jsonl"
"$verl" generate --model "$demo" --input "$work/in.jsonl" --n 2 --temperature 0 --max-tokens 24 > "$work/gen2.jsonl"
check "generate is deterministic" cmp -s "$work/gen1.jsonl" "$work/gen2.jsonl"
check "generate output" python3 -c "
import json
rows = [json.loads(l) for l in open('$work/gen1.jsonl')]
assert [(r['index'], r['sample']) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)], rows
assert all(r['finish_reason'] in ('stop', 'length') and len(r['response_tokens']) == len(r['response_logprobs']) for r in rows)
assert rows[0]['text'].startswith('12 + 30 = '), rows[0]['text']"
# A bad --device names the flag.
"$verl" generate --model "$demo" --prompt "x" --device gpu > /dev/null 2> "$work/err_dev.txt"
check "generate bad device exits 1" test $? -eq 1
check "generate bad device names --device" grep -q -- "--device must be cpu, cuda or auto, got 'gpu'" "$work/err_dev.txt"
# A stop string ends the text before it.
"$verl" generate --model "$demo" --input "$work/in.jsonl" --temperature 0 --max-tokens 24 --stop "=" > "$work/gen3.jsonl"
check "generate stop string" python3 -c "
import json
r = json.loads(open('$work/gen3.jsonl').readline())
assert r['finish_reason'] == 'stop_string' and '=' not in r['text'], r"

# tokenize round trip with the chat template.
echo '{"messages": [{"role": "user", "content": "What is 7 * 8?"}], "add_generation_prompt": true}' |
  "$verl" tokenize --tokenizer "$demo" --chat > "$work/chat.jsonl"
check "tokenize chat" python3 -c "
import json
r = json.loads(open('$work/chat.jsonl').readline())
assert r['text'] == '<|im_start|>user\nWhat is 7 * 8?<|im_end|>\n<|im_start|>assistant\n', r['text']
assert r['ids'][0] == 510 and r['ids'][-1] == 198, r['ids']"

# train: a misspelt key is an error that suggests the right one.
"$verl" train "$root/configs/demo.yaml" actor_rollout_ref.rollout.temprature=0.5 > /dev/null 2> "$work/err2.txt"
check "train bad key exits 1" test $? -eq 1
check "train bad key suggests" grep -q "actor_rollout_ref.rollout.temperature" "$work/err2.txt"
# A missing dataset file is named.
"$verl" train "$root/configs/demo.yaml" actor_rollout_ref.model.path="$demo" data.train_files=[/nonexistent/train.jsonl] > /dev/null 2> "$work/err3.txt"
check "train missing data file" grep -q "/nonexistent/train.jsonl" "$work/err3.txt"

# bench train on CPU: exactly one JSON line; the FLOP count follows the documented formula.
"$verl" bench train --device cpu --shape tiny --batch 2 --seq 64 --steps 1 --warmup 0 > "$work/bench.jsonl"
check "bench train json" python3 -c "
import json, math
lines = open('$work/bench.jsonl').read().splitlines()
assert len(lines) == 1, lines
r = json.loads(lines[0])
assert r['bench'] == 'train' and r['device'] == 'cpu' and r['shape'] == 'tiny' and r['recompute'] is False, r
assert r['params'] == 12591744 and r['tokens_per_step'] == 128, r
assert r['tokens_per_s'] > 0 and r['step_ms'] > 0 and r['peak_memory_bytes'] > 0, r
L, B, S, H, D = 6, 2, 64, 6, 64
assert r['model_flops_per_step'] == 6 * r['params'] * B * S + 6 * L * B * S * S * H * D, r
assert math.isclose(r['mfu'], r['tflops'] / r['peak_tflops']), r
assert abs(r['loss'] - math.log(8192)) < 0.5, r  # N(0, 0.02) weights: near-uniform next-token guess"
# Bad arguments name the flag.
"$verl" bench train --device cpu --shape qwen9 > /dev/null 2> "$work/err4.txt"
check "bench bad shape exits non-zero" test $? -ne 0
check "bench bad shape names --shape" grep -q -- "--shape 'qwen9' is not a known shape" "$work/err4.txt"
"$verl" bench train --device cpu --shape tiny --batch 0 > /dev/null 2> "$work/err5.txt"
check "bench bad batch names --batch" grep -q -- "--batch must be >= 1" "$work/err5.txt"

# bench grpo-step times the trainer's own step: on the demo config (cpu) its step is the step
# `verl train` runs, so the same config and seed give the same numbers.
"$verl" bench grpo-step > /dev/null 2> "$work/err6.txt"
check "bench grpo-step without a config exits non-zero" test $? -ne 0
check "bench grpo-step without a config says so" grep -q -- "bench grpo-step needs a config" "$work/err6.txt"
"$verl" bench grpo-step configs/demo.yaml --steps 0 > /dev/null 2> "$work/err7.txt"
check "bench grpo-step bad steps names the flag" grep -q -- "--steps must be >= 1" "$work/err7.txt"
demo_over="trainer.device=cpu data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8 trainer.val_before_train=false trainer.save_freq=-1 trainer.test_freq=-1 trainer.logger=[jsonl]"
# shellcheck disable=SC2086  # word lists on purpose
(cd "$root" && "$verl" bench grpo-step configs/demo.yaml $demo_over trainer.default_local_dir="$work/bench_run" \
  --steps 1 --warmup 0 > "$work/grpo.jsonl" 2> /dev/null)
check "bench grpo-step exits 0 on cpu" test $? -eq 0
# shellcheck disable=SC2086
(cd "$root" && "$verl" train configs/demo.yaml $demo_over trainer.total_training_steps=1 \
  trainer.default_local_dir="$work/train_run" > /dev/null 2>&1)
check "verl train on the same config exits 0" test $? -eq 0
check "bench grpo-step json is the trainer's step" python3 -c "
import json
lines = open('$work/grpo.jsonl').read().splitlines()
assert len(lines) == 1, lines
r = json.loads(lines[0])
assert r['bench'] == 'grpo_step' and r['device'] == 'cpu' and r['steps'] == 1, r
assert {'gen', 'adv', 'update_actor', 'step'} <= set(r['phase_s']), r['phase_s']
assert r['prompts'] == 8 and r['n'] == 8 and r['tokens_per_s'] > 0, r
m = r['last_step_metrics']
t = [json.loads(l) for l in open('$work/train_run/metrics.jsonl')]
t = [x for x in t if x.get('step') == 1][0]
for k in ('perf/total_num_tokens', 'critic/score/mean', 'actor/pg_loss', 'actor/grad_norm', 'response_length/mean'):
    assert m[k] == t[k], (k, m[k], t[k])
assert r['tokens_per_step'] == t['perf/total_num_tokens'], r"

# Hydra's --config-path / --config-name, as verl's launch scripts pass them.
mkdir -p "$work/hydra"
cp "$root/configs/demo.yaml" "$work/hydra/demo_port.yaml"
"$verl" train --config-path "$work/hydra" --config-name nope > /dev/null 2> "$work/err_hydra.txt"
check "unknown --config-name exits non-zero" test $? -ne 0
check "unknown --config-name names the flag" grep -q -- "--config-name nope with --config-path" "$work/err_hydra.txt"
(cd "$root" && "$verl" train --config-path "$work/hydra" --config-name demo_port.yaml trainer.device=cpu \
  trainer.total_training_steps=1 trainer.val_before_train=false trainer.save_freq=-1 trainer.test_freq=-1 \
  trainer.logger=[jsonl] trainer.default_local_dir="$work/hydra/run" > /dev/null 2>&1)
check "--config-path DIR --config-name NAME.yaml trains" test -s "$work/hydra/run/metrics.jsonl"
# `verl config` takes the same pair (the multi-turn examples launch with it).
"$verl" config --config-path "$work/hydra" --config-name demo_port trainer.total_training_steps=3 > "$work/hydra_cfg.yaml" 2>&1
check "verl config --config-path/--config-name loads DIR/NAME.yaml" grep -q "total_training_steps: 3" "$work/hydra_cfg.yaml"
check "... with the file's values" grep -q "train_batch_size: 32" "$work/hydra_cfg.yaml"
"$verl" config --config-path "$work/hydra" --config-name nope > /dev/null 2> "$work/err_hydra_cfg.txt"
check "verl config: unknown --config-name names the flag" grep -q -- "--config-name nope with --config-path" "$work/err_hydra_cfg.txt"

# ---- hostile inputs (issue 24): each is an error naming what is wrong, exit 1, never a crash ----
quick="trainer.device=cpu data.train_batch_size=4 actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.rollout.n=2 data.max_response_length=8 trainer.val_before_train=false trainer.save_freq=-1 trainer.test_freq=-1 trainer.logger=[jsonl] trainer.total_training_steps=1 data.val_files=null"
# Sampling keys out of range are rejected by name at load (top_p=0 used to abort in the sampler).
# shellcheck disable=SC2086
(cd "$root" && "$verl" train configs/demo.yaml $quick actor_rollout_ref.rollout.top_p=0 \
  trainer.default_local_dir="$work/topp" > /dev/null 2> "$work/err_topp.txt")
check "top_p=0 exits 1" test $? -eq 1
check "top_p=0 names the key" grep -q "actor_rollout_ref.rollout.top_p = 0.0 is out of range; expected a value in (0, 1\]" "$work/err_topp.txt"
# shellcheck disable=SC2086
(cd "$root" && "$verl" train configs/demo.yaml $quick actor_rollout_ref.rollout.val_kwargs.top_p=1.5 \
  trainer.default_local_dir="$work/topp2" > /dev/null 2> "$work/err_topp2.txt")
check "val_kwargs.top_p=1.5 names the key" grep -q "actor_rollout_ref.rollout.val_kwargs.top_p = 1.5 is out of range" "$work/err_topp2.txt"
# An error during generation while the reward worker runs comes out as its message (was exit 134).
# shellcheck disable=SC2086
(cd "$root" && VERL_FAULT_INJECT=gen:1:error "$verl" train configs/demo.yaml $quick trainer.actor_reward_parallel=true \
  trainer.default_local_dir="$work/generr" > /dev/null 2> "$work/err_gen.txt")
check "generation error exits 1" test $? -eq 1
check "generation error says why" grep -q "injected fault at gen:1" "$work/err_gen.txt"
# An update whose gradient norm is not finite is skipped (as verl does) and says so, naming the
# step; the weights stay as they were (the next step's log-probs of the same batch agree).
# shellcheck disable=SC2086
(cd "$root" && VERL_FAULT_INJECT=grad_norm:1:nan "$verl" train configs/demo.yaml $quick trainer.total_training_steps=2 \
  trainer.default_local_dir="$work/nangrad" > /dev/null 2> "$work/err_nangrad.txt")
check "a non-finite gradient norm does not stop the run" test $? -eq 0
check "the skipped update is reported with its step" grep -q \
  "step 2: the actor's gradient norm was not finite in 1 of its 1 optimizer steps; those updates were skipped" \
  "$work/err_nangrad.txt"
check "the skipped step's grad_norm is NaN, the first step's finite" python3 -c "
import json, math
m = [json.loads(l) for l in open('$work/nangrad/metrics.jsonl')]
assert len(m) == 2 and math.isfinite(m[0]['actor/grad_norm']) and m[1]['actor/grad_norm'] is None, m"

# A model whose embedding has more rows than the tokenizer has tokens (as Qwen2.5's): sampled ids
# past the vocabulary decode to nothing and are counted; training goes on.
python3 -c "
import json; c = json.load(open('$demo/config.json')); c['vocab_size'] = 1024
json.dump(c, open('$work/big_vocab.json', 'w'))
c['vocab_size'] = 256; json.dump(c, open('$work/small_vocab.json', 'w'))"
"$verl" init-model --config "$work/big_vocab.json" --tokenizer "$demo" --out "$work/big_vocab" > /dev/null 2>&1
# shellcheck disable=SC2086
(cd "$root" && "$verl" train configs/demo.yaml $quick actor_rollout_ref.model.path="$work/big_vocab" \
  trainer.default_local_dir="$work/oov" > /dev/null 2> "$work/err_oov.txt")
check "ids past the vocabulary do not abort training" test $? -eq 0
check "ids past the vocabulary are counted" python3 -c "
import json
m = [json.loads(l) for l in open('$work/oov/metrics.jsonl')][-1]
assert m['rollout/out_of_vocab_tokens'] > 0, m.get('rollout/out_of_vocab_tokens')"
"$verl" init-model --config "$work/small_vocab.json" --tokenizer "$demo" --out "$work/small_vocab" > /dev/null 2> "$work/err_small.txt"
check "init-model with a vocab smaller than the tokenizer's exits 1" test $? -eq 1
check "init-model names both sizes" grep -q "vocab_size 256 is smaller than the tokenizer's 512 tokens" "$work/err_small.txt"

# Chat templates that recurse or loop without end stop with an error naming the line.
evil_tok() {  # evil_tok DIR TEMPLATE: the demo tokenizer with another chat template
  mkdir -p "$1" && cp "$demo/tokenizer.json" "$1/" &&
    python3 -c "
import json, sys; c = json.load(open('$demo/tokenizer_config.json')); c['chat_template'] = sys.argv[1]
json.dump(c, open('$1/tokenizer_config.json', 'w'))" "$2"
}
msg='{"messages": [{"role": "user", "content": "hi"}]}'
evil_tok "$work/tok_rec" $'{% macro f(x) %}{{ f(x) }}{% endmacro %}\n{{ f(1) }}'
echo "$msg" | "$verl" tokenize --tokenizer "$work/tok_rec" --chat > /dev/null 2> "$work/err_rec.txt"
check "recursive macro exits 1 (was a segfault)" test $? -eq 1
check "recursive macro names the line" grep -q "chat_template:1:.*macro 'f' nested more than 100 calls deep" "$work/err_rec.txt"
evil_tok "$work/tok_range" $'\n{% for i in range(100000000) %}x{% endfor %}'
echo "$msg" | "$verl" tokenize --tokenizer "$work/tok_range" --chat > /dev/null 2> "$work/err_range.txt"
check "huge range exits 1" test $? -eq 1
check "huge range names the line" grep -q "chat_template:2:.*range() of 100000000 items is over the limit of 100000" "$work/err_range.txt"
"$verl" generate --model "$demo" --prompt "x" --n 100000000 > /dev/null 2> "$work/err_n.txt"
check "generate --n 100000000 exits 1" test $? -eq 1
check "generate --n names the flag and the limit" grep -q -- "--n must be in \[1, 1048576\]" "$work/err_n.txt"

# A directory given as a file is an error naming it (was read as an empty file).
mkdir -p "$work/adir"
"$verl" config "$work/adir" > /dev/null 2> "$work/err_dir1.txt"
check "config DIR exits 1" test $? -eq 1
check "config DIR names it" grep -q "cannot open config file $work/adir: it is a directory" "$work/err_dir1.txt"
"$verl" train "$work/adir" > /dev/null 2> "$work/err_dir2.txt"
check "train DIR names it" grep -q "$work/adir: it is a directory" "$work/err_dir2.txt"
"$verl" logprobs --model "$golden" --input "$work/adir" > /dev/null 2> "$work/err_dir3.txt"
check "logprobs --input DIR names it" grep -q -- "cannot open --input $work/adir: it is a directory" "$work/err_dir3.txt"
"$verl" tokenize --tokenizer "$demo" --input "$work/adir" > /dev/null 2> "$work/err_dir4.txt"
check "tokenize --input DIR names it" grep -q -- "cannot open --input $work/adir: it is a directory" "$work/err_dir4.txt"

# A full disk: metrics.jsonl cannot be written, and the run says so instead of exiting 0.
mkdir -p "$work/full" && ln -sf /dev/full "$work/full/metrics.jsonl"
# shellcheck disable=SC2086
(cd "$root" && "$verl" train configs/demo.yaml $quick trainer.default_local_dir="$work/full" > /dev/null 2> "$work/err_full.txt")
check "full disk exits 1" test $? -eq 1
check "full disk names metrics.jsonl" grep -q "jsonl: write to '$work/full/metrics.jsonl' failed: No space left on device" "$work/err_full.txt"

# A checkpoint that cannot be written: the run stops naming the step and the last complete
# checkpoint, the partial directory is gone, and the trained step's metrics are in the log. First an
# error injected into step 2's save, then (where a tmpfs can be mounted: root on Linux) a real full
# disk of 16 MiB, which holds one of the demo's 10 MiB checkpoints.
ck_fail() {  # ck_fail DIR STEP_THAT_FAILS ERR_FILE: the checks common to both
  check "failed save exits 1 ($1)" test "$(cat "$1.rc")" -eq 1
  check "failed save names the step ($1)" grep -q "the checkpoint of step $2 was not written" "$3"
  check "failed save names the last checkpoint ($1)" grep -q "the last complete checkpoint is $1/global_step_$(($2 - 1)) (trainer.resume_mode=auto continues from it)" "$3"
  check "failed save leaves no partial files ($1)" test ! -e "$1/.tmp_global_step_$2"
  check "failed save keeps the tracker ($1)" test "$(cat "$1/latest_checkpointed_iteration.txt")" = $(($2 - 1))
  check "failed save logs the step ($1)" test "$(wc -l < "$1/metrics.jsonl")" -eq "$2"
}
ck_args=(trainer.total_training_steps=3 trainer.save_freq=1)
# shellcheck disable=SC2086
(cd "$root" && VERL_FAULT_INJECT=save:2:error "$verl" train configs/demo.yaml $quick "${ck_args[@]}" \
  trainer.default_local_dir="$work/ck_err" > /dev/null 2> "$work/err_ck.txt"; echo $? > "$work/ck_err.rc")
ck_fail "$work/ck_err" 2 "$work/err_ck.txt"
check "failed save gives the cause" grep -q "injected fault at save:2" "$work/err_ck.txt"
mkdir -p "$work/ck_full"
if mount -t tmpfs -o size=16m tmpfs "$work/ck_full" 2> /dev/null; then
  # shellcheck disable=SC2086
  (cd "$root" && "$verl" train configs/demo.yaml $quick "${ck_args[@]}" trainer.default_local_dir="$work/ck_full/run" \
    > /dev/null 2> "$work/err_ck_full.txt"; echo $? > "$work/ck_full/run.rc")
  ck_fail "$work/ck_full/run" 2 "$work/err_ck_full.txt"
  check "full disk at a save says so" grep -q "No space left on device" "$work/err_ck_full.txt"
  check "full disk at a save says what to do" grep -q "free space in $work/ck_full/run, or keep fewer (trainer.max_actor_ckpt_to_keep)" "$work/err_ck_full.txt"
  umount "$work/ck_full"
  # `verl sft` on a disk that holds one of its 10.2 MiB checkpoints (a 3.4 MiB model and its AdamW
  # moments): the step-2 save fails whole.
  mount -t tmpfs -o size=12m tmpfs "$work/ck_full"
  "$verl" init-model --config "$root/configs/demo/model_config.json" --tokenizer "$root/assets/demo" --out "$work/sft_init" > /dev/null 2>&1
  (cd "$root" && OMP_NUM_THREADS=1 "$verl" sft configs/demo/sft.yaml model.partial_pretrain="$work/sft_init" \
    data.train_batch_size=8 trainer.total_training_steps=3 trainer.save_freq=1 trainer.logger=[jsonl] \
    trainer.default_local_dir="$work/ck_full/sft" > /dev/null 2> "$work/err_sft_full.txt")
  check "sft full disk exits 1" test $? -eq 1
  check "sft full disk names the step" grep -q "the checkpoint of step 2 was not written: .*No space left on device" "$work/err_sft_full.txt"
  check "sft full disk names what is left" grep -q "the last complete checkpoint is $work/ck_full/sft/global_step_1 (trainer.resume_mode=auto continues from it); free space in $work/ck_full/sft, or keep fewer (trainer.max_ckpt_to_keep)" "$work/err_sft_full.txt"
  check "sft full disk leaves step 1 whole" test -f "$work/ck_full/sft/global_step_1/model.safetensors"
  check "sft full disk leaves no partial files" test ! -e "$work/ck_full/sft/.tmp_global_step_2" -a ! -e "$work/ck_full/sft/global_step_2"
  check "sft full disk logs the step" test "$(wc -l < "$work/ck_full/sft/metrics.jsonl")" -eq 2
  umount "$work/ck_full"
else
  echo "note: no tmpfs could be mounted here; the real full-disk save is not checked"
fi

# Rows a built-in scorer cannot score fail when the dataset loads, naming file:line.
good_row=$(head -1 "$root/assets/demo/train.jsonl")
printf '%s\n%s\n' "$good_row" '{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "q"}], "reward_model": {"style": "rule", "ground_truth": [1, 2]}}' > "$work/bad_gt.jsonl"
printf '%s\n' '{"data_source": "nope", "prompt": [{"role": "user", "content": "q"}], "reward_model": {"style": "rule", "ground_truth": "1"}}' > "$work/bad_src.jsonl"
: > "$work/empty.jsonl"
# shellcheck disable=SC2086
(cd "$root" && "$verl" train configs/demo.yaml $quick data.train_files="[$work/bad_gt.jsonl]" trainer.default_local_dir="$work/bad1" > /dev/null 2> "$work/err_gt.txt")
check "bad ground_truth names file:line" grep -q "$work/bad_gt.jsonl:2: gsm8k: ground_truth must be a string" "$work/err_gt.txt"
# shellcheck disable=SC2086
(cd "$root" && "$verl" train configs/demo.yaml $quick data.train_files="[$work/bad_src.jsonl]" trainer.default_local_dir="$work/bad2" > /dev/null 2> "$work/err_src.txt")
check "unknown data_source names file:line" grep -q "$work/bad_src.jsonl:1: no reward function for data_source 'nope'" "$work/err_src.txt"
# shellcheck disable=SC2086
(cd "$root" && "$verl" train configs/demo.yaml $quick data.val_files="[$work/empty.jsonl]" trainer.default_local_dir="$work/bad3" > /dev/null 2> "$work/err_empty.txt")
check "empty validation file is named" grep -q "data: $work/empty.jsonl hold(s) no rows" "$work/err_empty.txt"
check "empty validation file does not blame train_batch_size" bash -c "! grep -q train_batch_size '$work/err_empty.txt'"
# More tokens than max_position_embeddings (256 for the golden model) are refused up front.
python3 -c "import json; print(json.dumps({'tokens': [1] * 300}))" | "$verl" logprobs --model "$golden" > /dev/null 2> "$work/err_long.txt"
check "logprobs too long exits 1" test $? -eq 1
check "logprobs too long names the limit" grep -q "<stdin>:1: 300 tokens are more than the model's max_position_embeddings 256" "$work/err_long.txt"
# cuBLASLt is opened at the first GEMM, not at start (docs/cuda.md): `verl --help` never loads it.
check "verl --help does not load cuBLASLt" bash -c "! LD_DEBUG=libs '$verl' --help 2>&1 | grep -q 'calling init: .*libcublasLt'"
# Sizes and numbers given as flags are checked before anything is allocated or computed.
flag_err() {  # flag_err NAME EXPECTED COMMAND...: exits 1 and prints EXPECTED
  "${@:3}" < /dev/null > /dev/null 2> "$work/err_flag.txt"
  check "$1 exits 1" test $? -eq 1
  check "$1 names it" grep -q -- "$2" "$work/err_flag.txt"
}
flag_err "generate --kv-cache-mb -1" "--kv-cache-mb must be in \[1, 1073741824\], got -1" "$verl" generate --model "$demo" --prompt x --device cpu --kv-cache-mb -1
flag_err "generate --kv-cache-mb past the host" "--kv-cache-mb 1073741824 is more than this machine's" "$verl" generate --model "$demo" --prompt x --device cpu --kv-cache-mb 1073741824
flag_err "logprobs --max-batch-tokens 0" "--max-batch-tokens must be positive, got 0" "$verl" logprobs --model "$golden" --max-batch-tokens 0
flag_err "init-model --std nan" "--std must be a finite number >= 0, got nan" "$verl" init-model --config "$demo/config.json" --out "$work/im" --std nan
flag_err "score --calibration-samples 10^8" "--calibration-samples 100000000: want 0 (round to nearest) to 16384" "$verl" score --model "$root/tests/fixtures/score/qwen2_rm" --quantize int4 --calibration-samples 100000000
# Sizes in a config that no machine holds: named before anything is allocated, or (a response
# longer than the whole CPU KV cache, half of the host's memory) when the rollout plans it.
# shellcheck disable=SC2086
flag_err "rollout.n 10^8" "data.gen_batch_size 4 x actor_rollout_ref.rollout.n 100000000 = 400000000 sequences a step over 1 rank(s), more than the 1048576 a rank holds" \
  env -C "$root" "$verl" train configs/demo.yaml $quick actor_rollout_ref.rollout.n=100000000 trainer.default_local_dir="$work/big1"
# shellcheck disable=SC2086
flag_err "max_response_length 10^9" "prompt [0-9]* + max_tokens 1000000000 = [0-9]* tokens need 62500002 KV blocks" \
  env -C "$root" "$verl" train configs/demo.yaml $quick data.max_response_length=1000000000 trainer.default_local_dir="$work/big2"
check "max_response_length 10^9 warns of the cap" grep -q "the CPU engine holds .* GiB (half of this machine's memory)" "$work/err_flag.txt"
# An input line the chat template cannot render, and ids that are not ids: named by line.
printf '%s\n' '{"messages": [{"role": "user", "content": "ok"}]}' '{"messages": [{"role": "user", "content": 5}]}' > "$work/gen_bad.jsonl"
flag_err "generate template error" "$work/gen_bad.jsonl:2: chat_template:2:45: can only concatenate str (not \"int\") to str" \
  "$verl" generate --model "$demo" --input "$work/gen_bad.jsonl" --max-tokens 2 --device cpu
printf '%s\n' '{"prompt_tokens": [5, 1e20]}' > "$work/gen_ids.jsonl"
flag_err "generate float id" "$work/gen_ids.jsonl:1: prompt_tokens\[1\] is not an integer: 1e+20" \
  "$verl" generate --model "$demo" --input "$work/gen_ids.jsonl" --max-tokens 2 --device cpu
printf '%s\n' '{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"role": "assistant", "content": "x"}]}' > "$work/sft_bad.jsonl"
flag_err "sft template error" "$work/sft_bad.jsonl:1: chat_template:2:45: can only concatenate str (not \"list\") to str" \
  env -C "$root" "$verl" sft configs/demo/sft.yaml model.partial_pretrain="$root/assets/demo/model" data.train_files="$work/sft_bad.jsonl" \
  data.val_files=null data.train_batch_size=1 trainer.total_training_steps=1 trainer.default_local_dir="$work/sft_bad"
# JSON nested 100000 deep (a dataset row's extra_info crashed the trainer when copied; an input
# line): refused naming the line.
python3 - "$root/assets/demo/train.jsonl" "$work/deep.jsonl" <<'PY'
import json, sys
row = json.loads(open(sys.argv[1]).readline())
row["extra_info"] = {"x": "REPLACE"}
open(sys.argv[2], "w").write(json.dumps(row).replace('"REPLACE"', "[" * 100000 + "]" * 100000) + "\n")
PY
# shellcheck disable=SC2086
(cd "$root" && "$verl" train configs/demo.yaml $quick data.train_files="[$work/deep.jsonl]" data.train_batch_size=1 \
  actor_rollout_ref.actor.ppo_mini_batch_size=1 trainer.default_local_dir="$work/deep" > /dev/null 2> "$work/err_deep.txt")
check "deep dataset row exits 1" test $? -eq 1
check "deep dataset row names the line" grep -q "$work/deep.jsonl:1: JSON nested more than 512 levels deep" "$work/err_deep.txt"
python3 -c "print('{\"tokens\": ' + '[' * 9999 + ']' * 9999 + '}')" > "$work/deep_tokens.jsonl"
flag_err "logprobs deep line" "$work/deep_tokens.jsonl:1: JSON nested more than 512 levels deep" "$verl" logprobs --model "$golden" --input "$work/deep_tokens.jsonl"
# SIGTERM while a reward command runs. term_during_reward NAME COMMAND...: COMMAND's reward command
# is `sh $work/NAME.sh`, which writes its pid to $work/NAME.pid, then sleeps (exec: the pid is the
# sleep's); once it runs, COMMAND gets SIGTERM. Its stderr goes to $work/err_NAME.txt, its exit
# status to $term_rc.
term_during_reward() {
  printf '#!/bin/sh\necho $$ > "%s/%s.pid"\nexec sleep 300\n' "$work" "$1" > "$work/$1.sh"
  rm -f "$work/$1.pid"
  "${@:2}" > /dev/null 2> "$work/err_$1.txt" &
  local pid=$!
  for _ in $(seq 1 600); do [ -s "$work/$1.pid" ] && break; sleep 0.2; done
  kill -TERM "$pid"
  wait "$pid"
  term_rc=$?
}
# A training run: the command is killed with the run, and the log says the step was abandoned.
# shellcheck disable=SC2086
term_during_reward sig env -C "$root" "$verl" train configs/demo.yaml $quick custom_reward_function.command="sh $work/sig.sh" \
  custom_reward_function.timeout_s=300 trainer.default_local_dir="$work/sig"
check "SIGTERM ends the run with the signal's status" test "$term_rc" -eq 143
check "SIGTERM says the step was abandoned" grep -q "verl: SIGTERM: step 1 was in progress and is abandoned" "$work/err_sig.txt"
reward_pid=$(cat "$work/sig.pid" 2> /dev/null || echo 0)
for _ in $(seq 1 50); do kill -0 "$reward_pid" 2> /dev/null || break; sleep 0.1; done
check "SIGTERM kills the reward command" bash -c "! kill -0 $reward_pid 2> /dev/null"
# A command that is not a training loop: no word about training steps.
printf '%s\n' '{"data_source": "arith", "solution_str": "1", "ground_truth": "1"}' > "$work/reward_rows.jsonl"
term_during_reward sig2 "$verl" reward --input "$work/reward_rows.jsonl" --command "sh $work/sig2.sh" --timeout 300
check "SIGTERM to verl reward exits 143" test "$term_rc" -eq 143
check "SIGTERM to verl reward says nothing of steps" grep -qx "verl: SIGTERM; killed 1 child program group(s); stopping" "$work/err_sig2.txt"

# verl's launch scripts (tests/fixtures/verl_scripts, README there): each override list, with only
# its paths substituted, loads through `verl config` (the loader `verl train` and `verl sft` use).
# At least 90% are accepted; each other one fails with every `# expect-error:` line of its header.
scripts=$root/tests/fixtures/verl_scripts
script_args() {  # script_args FIXTURE DATA: the fixture's overrides with the paths filled in
  grep -v '^#' "$1" | sed "s|@DATA@|$2|; s|@MODEL@|$demo|; s|@SAVE_DIR@|$work/verl_scripts/$(basename "$1" .txt)|; s|@REWARD_PY@|$root/tests/fixtures/python_reward/rubric_reward.py|"
}
total=0 accepted=0
for f in "$scripts"/*.txt; do
  name=$(basename "$f" .txt)
  total=$((total + 1))
  defaults=()
  grep -q '^# entry: .*sft' "$f" && defaults=(--defaults "$root/configs/sft_trainer.yaml")
  mapfile -t args < <(script_args "$f" "$root/assets/demo/train.jsonl")
  "$verl" config "${defaults[@]}" "${args[@]}" > /dev/null 2> "$work/script_err.txt"
  rc=$?
  if ! grep -q '^# expect-error: ' "$f"; then
    check "verl script $name is accepted" test $rc -eq 0
    [ $rc -eq 0 ] && accepted=$((accepted + 1))
  else
    check "verl script $name is rejected" test $rc -ne 0
    while IFS= read -r want; do
      check "verl script $name names the key and reason: $want" grep -qF -- "$want" "$work/script_err.txt"
    done < <(sed -n 's/^# expect-error: //p' "$f")
  fi
done
echo "verl scripts: $accepted of $total accepted"
check "at least 90% of verl's scripts are accepted ($accepted of $total)" test $((accepted * 10)) -ge $((total * 9))
# Seven of them train 2 steps on the demo model, sizes shrunk by overrides appended after the script's.
shrink=(data.train_files="[$root/assets/demo/train.jsonl]" data.val_files="[$root/assets/demo/val.jsonl]"
  data.train_batch_size=4 data.max_prompt_length=32 data.max_response_length=24
  actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.rollout.n=2 trainer.total_training_steps=2
  trainer.device=cpu trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.val_before_train=false
  trainer.test_freq=-1 trainer.save_freq=-1 trainer.logger=[jsonl])
for name in grpo_trainer__run_qwen3_8b_fsdp ppo_trainer__run_qwen3_8b_fsdp rloo_trainer__run_qwen3_8b_fsdp \
  reinforce_plus_plus_trainer__run_qwen3_8b_fsdp gpg_trainer__run_qwen3_8b_fsdp gdpo_trainer__run_qwen3_8b_fsdp \
  jan2026__rollout_correction__run_with_rollout_corr; do
  mapfile -t args < <(script_args "$scripts/$name.txt" "$root/assets/demo/train.jsonl")
  out=$work/verl_scripts/$name
  (cd "$root" && "$verl" train "${args[@]}" "${shrink[@]}" trainer.default_local_dir="$out" > "$work/$name.log" 2>&1)
  check "verl script $name trains 2 steps" python3 -c "
import json
rows = [json.loads(l) for l in open('$out/metrics.jsonl')]
assert [r['step'] for r in rows] == [1, 2], rows
assert all(0.0 <= r['critic/score/mean'] <= 1.0 for r in rows), rows
print('$name: critic/score/mean', [r['critic/score/mean'] for r in rows])"
done
# The January rollout-correction spelling with values: a ratio band and the per-token veto.
name=jan2026__rollout_correction__run_with_rollout_corr
mapfile -t args < <(script_args "$scripts/$name.txt" "$root/assets/demo/train.jsonl")
out=$work/verl_scripts/${name}_veto
rc_keys=(algorithm.rollout_correction.rollout_rs=token algorithm.rollout_correction.rollout_rs_threshold=2.0
  algorithm.rollout_correction.rollout_rs_threshold_lower=0.5 algorithm.rollout_correction.rollout_token_veto_threshold=1e-4)
(cd "$root" && "$verl" train "${args[@]}" "${shrink[@]}" "${rc_keys[@]}" trainer.default_local_dir="$out" > "$work/${name}_veto.log" 2>&1)
check "January rollout_rs_threshold_lower and rollout_token_veto_threshold train 2 steps" python3 -c "
import json
rows = [json.loads(l) for l in open('$out/metrics.jsonl')]
assert [r['step'] for r in rows] == [1, 2], rows
assert all(r['rollout_corr/rollout_is_veto_fraction'] == 0.0 and 'rollout_corr/rollout_rs_token_k1_masked_fraction' in r for r in rows), rows"
# And the multi-turn SFT script trains 2 steps with `verl sft`.
name=sft__multiturn__run_qwen2_5_0_5b_fsdp
mapfile -t args < <(script_args "$scripts/$name.txt" "$root/assets/demo/sft.jsonl")
(cd "$root" && "$verl" sft "${args[@]}" data.train_batch_size=4 data.micro_batch_size_per_gpu=4 \
  data.train_max_samples=16 data.val_max_samples=8 trainer.total_training_steps=2 trainer.logger=[jsonl] \
  > "$work/$name.log" 2>&1)
check "verl script $name trains 2 steps" python3 -c "
import json
rows = [json.loads(l) for l in open('$work/verl_scripts/$name/metrics.jsonl')]
assert [r['step'] for r in rows] == [1, 2] and all(r['train/loss'] > 0 for r in rows), rows"
# verl's other config names are refused with what to use instead.
"$verl" train --config-name ppo_megatron_trainer > /dev/null 2> "$work/err_megatron.txt"
check "--config-name ppo_megatron_trainer is refused by name" grep -q "Megatron-LM is not supported" "$work/err_megatron.txt"
"$verl" train "$root/configs/demo.yaml" model_engine=megatron > /dev/null 2> "$work/err_engine.txt"
check "model_engine=megatron is refused by name" grep -q "model_engine = megatron is a verl option" "$work/err_engine.txt"

echo "cli: $pass passed, $fail failed"
test "$fail" -eq 0
