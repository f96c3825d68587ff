#!/usr/bin/env bash
# Reward models: `verl score` against transformers' fp32 scores (tests/fixtures/golden/llama_rm, and
# tests/fixtures/score/* from tools/make_score_fixtures.py: token and chat-message inputs) within
# 1e-4, in input order; its errors name the file, line and what was expected; and a GRPO run on the
# demo with reward_model.enable=true scores every response with the model.
# Usage: score.sh VERL_BINARY REPO_ROOT WORK_DIR
set -uo pipefail
verl=$1 root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=tests/e2e/lib.sh
. "$root/tests/e2e/lib.sh"
# close A B: the "score" of every line of A and B within 1e-4 (absolute, and relative to large ones).
close() {
  python3 - "$1" "$2" <<'PY'
import json, sys
a = [json.loads(l)["score"] for l in open(sys.argv[1])]
b = [json.loads(l)["score"] for l in open(sys.argv[2])]
assert len(a) == len(b) and a, (len(a), len(b))
worst = max(abs(x - y) / max(1.0, abs(y)) for x, y in zip(a, b))
print(f"{sys.argv[2]}: {len(a)} scores, largest difference {worst:.2e}")
sys.exit(0 if worst <= 1e-4 else 1)
PY
}
# fails CMD... PATTERN: CMD exits 1 and its stderr has PATTERN (a fixed string).
fails() {
  local pattern=${*: -1}
  "${@:1:$#-1}" > "$work/out.txt" 2> "$work/err.txt"
  local rc=$?
  [ $rc -eq 1 ] && grep -qF -- "$pattern" "$work/err.txt" || { echo "rc $rc: $(cat "$work/err.txt")"; return 1; }
}

# The golden Llama reward model (tools/make_golden.py): its four sequences.
g=$root/tests/fixtures/golden/llama_rm
python3 - "$g" "$work" <<'PY'
import json, struct, sys
g, work = sys.argv[1], sys.argv[2]
seqs = json.load(open(g + "/inputs.json"))["sequences"]
with open(work + "/golden_in.jsonl", "w") as f:
    for s in seqs: f.write(json.dumps({"tokens": s}) + "\n")
raw = open(g + "/golden.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
with open(work + "/golden_scores.jsonl", "w") as f:
    for i in range(len(seqs)):
        t = head[f"score.{i}"]
        assert t["dtype"] == "F32", t
        b0, _ = t["data_offsets"]
        f.write(json.dumps({"score": struct.unpack("<f", raw[8 + n + b0:8 + n + b0 + 4])[0]}) + "\n")
PY
"$verl" score --model "$g" --input "$work/golden_in.jsonl" --device cpu > "$work/golden_out.jsonl"
check "verl score runs on the golden Llama reward model" test $? -eq 0
check "golden Llama reward model = transformers" close "$work/golden_out.jsonl" "$work/golden_scores.jsonl"
# Input order is kept across forwards: one sequence a forward gives the same lines.
"$verl" score --model "$g" --input "$work/golden_in.jsonl" --device cpu --max-batch-seqs 1 > "$work/golden_one.jsonl"
check "one sequence a forward = packed" close "$work/golden_one.jsonl" "$work/golden_scores.jsonl"

check "the Llama and Qwen2 score fixtures are there" test -f "$root/tests/fixtures/score/llama_rm/scores.jsonl" -a \
  -f "$root/tests/fixtures/score/qwen2_rm/scores.jsonl"
for d in "$root"/tests/fixtures/score/*/; do
  name=$(basename "$d")
  "$verl" score --model "$d" --input "$d/inputs.jsonl" --device cpu > "$work/$name.jsonl" 2> "$work/$name.err"
  check "$name: verl score runs" test $? -eq 0
  check "$name: tokens and chat messages = transformers" close "$work/$name.jsonl" "$d/scores.jsonl"
done

# Weight-only quantisation: the Spearman rank correlation of int8 / int4 scores with the fp32 ones
# over 300 sequences. int8 must reach 0.99 and int4 (asymmetric, GPTQ over 128 random calibration
# sequences) 0.95, the issue's bars, at group 128 and 32, and GPTQ must beat int4 rounded to nearest
# (--calibration-samples 0, printed beside them) on the golden model. Three models:
# - the golden Llama reward model (random weights) on 300 random sequences (measured 0.9995, 0.9501
#   and 0.9519: the int4 margin is thin on random weights, docs/reward_model.md);
# - tiny Llama and Qwen2 reward models of the score fixtures' shape whose backbones `verl sft`
#   trained on the demo task (tools/make_trained_reward_model.sh), each on 300 conversations of the
#   task rendered with its chat template and on 300 random token sequences.
python3 - "$work" <<'PY'
import json, random, sys
w = sys.argv[1]
r = random.Random(1)
with open(f"{w}/golden_rank.jsonl", "w") as f:
    for _ in range(300):
        f.write(json.dumps({"tokens": [r.randrange(0, 256) for _ in range(r.randint(1, 100))]}) + "\n")
with open(f"{w}/trained_tokens.jsonl", "w") as f:
    for _ in range(300):
        f.write(json.dumps({"tokens": [r.randrange(0, 509) for _ in range(r.randint(1, 100))]}) + "\n")
PY
tail -n 300 "$root/assets/demo/sft.jsonl" | python3 -c '
import json, sys
for line in sys.stdin:
    print(json.dumps({"messages": json.loads(line)["messages"]}))' > "$work/trained_chat.jsonl"
variants=(none int8 int4 "int4 --group-size 32" "int4 --calibration-samples 0")
# rank_runs MODEL INPUT NAME: `verl score` of INPUT in every variant, to NAME_<variant>.jsonl.
rank_runs() {
  local q v
  for q in "${variants[@]}"; do
    v=$(echo "$q" | tr -d ' -')
    # shellcheck disable=SC2086
    "$verl" score --model "$1" --input "$2" --device cpu --quantize $q > "$work/$3_$v.jsonl" 2> "$work/$3_$v.err"
    check "$3: --quantize $q runs" test $? -eq 0
  done
}
# spearman NAME [--gptq-beats-rtn]: prints the variants' rank correlations with fp32 and holds the bars.
spearman() {
  python3 - "$work" "$@" <<'PY'
import json, sys
w, name = sys.argv[1], sys.argv[2]
load = lambda v: [json.loads(l)["score"] for l in open(f"{w}/{name}_{v}.jsonl")]
def ranks(x):
    r = [0] * len(x)
    for k, i in enumerate(sorted(range(len(x)), key=lambda i: x[i])):
        r[i] = k
    return r
def rho(a, b):
    ra, rb, n = ranks(a), ranks(b), len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
f = load("none")
s8, s4, s4g32, rtn = (rho(f, load(v)) for v in ("int8", "int4", "int4groupsize32", "int4calibrationsamples0"))
print(f"{name}: Spearman with fp32 over {len(f)} sequences: int8 {s8:.4f}, int4 GPTQ {s4:.4f} (group 128), "
      f"{s4g32:.4f} (group 32), int4 rounded to nearest {rtn:.4f} (group 128)")
assert len(f) == 300 and s8 >= 0.99 and s4 >= 0.95 and s4g32 >= 0.95, (s8, s4, s4g32)
assert "--gptq-beats-rtn" not in sys.argv or s4 > rtn, (s4, rtn)
assert load("int8") != f  # the weights did change
PY
}
rank_runs "$g" "$work/golden_rank.jsonl" golden
check "golden: int8 and int4 rank the sequences as fp32 does (Spearman)" spearman golden --gptq-beats-rtn
for arch in llama qwen2; do
  "$root/tools/make_trained_reward_model.sh" "$verl" $arch "$work/trained_$arch" 2> "$work/trained_$arch.err"
  check "a $arch reward model trained by verl sft" test $? -eq 0
  for input in chat tokens; do
    rank_runs "$work/trained_$arch" "$work/trained_$input.jsonl" "trained_${arch}_$input"
    check "trained $arch, $input: int8 and int4 rank as fp32 does (Spearman)" spearman "trained_${arch}_$input"
  done
done
grep "8 linear matrices quantised to int4 in groups of 128" "$work/golden_int4.err" | grep -q "GPTQ over 8192 calibration tokens"
check "the quantisation is reported" test $? -eq 0

# Errors.
printf '{"tokens": [1, 2]}\n{"tokens": [1, 9999]}\n' > "$work/oov.jsonl"
check "an id outside the vocabulary names the line" fails "$verl" score --model "$g" --input "$work/oov.jsonl" "oov.jsonl:2: token 1 is id 9999"
printf '{"tokens": [1, 2]}\n{"tokens": [1,\n' > "$work/bad.jsonl"
check "a line that is not JSON names the line" fails "$verl" score --model "$g" --input "$work/bad.jsonl" "bad.jsonl:2"
printf '{"text": "hi"}\n' > "$work/nokey.jsonl"
check "a line without tokens or messages" fails "$verl" score --model "$g" --input "$work/nokey.jsonl" 'expected {"tokens": [ids...]} or {"messages": [...]}'
printf '{"messages": [{"role": "user", "content": "hi"}]}\n' > "$work/msgs.jsonl"
check "messages without a tokenizer" fails "$verl" score --model "$g" --input "$work/msgs.jsonl" "has no tokenizer.json"
check "a causal LM is not a reward model" fails "$verl" score --model "$root/assets/demo/model" --input "$work/golden_in.jsonl" \
  "config.json: a reward model must be a ...ForSequenceClassification model, got Qwen2ForCausalLM"
check "an unknown --quantize is refused by name" fails "$verl" score --model "$g" --input "$work/golden_in.jsonl" --quantize int2 "--quantize int2: want none, int8 or int4"
check "a missing model directory" fails "$verl" score --model "$work/nope" --input "$work/golden_in.jsonl" "$work/nope"

# GRPO on the demo with a reward model of the demo's shape (random weights): the rewards are its
# scores (continuous, not the arithmetic scorer's 0/1).
demo_reward_model "$work/rm"
check "a demo-shaped reward model" test -f "$work/rm/model.safetensors"
OMP_NUM_THREADS=1 "$verl" train "$root/configs/demo.yaml" actor_rollout_ref.model.path="$root/assets/demo/model" \
  data.train_files="[$root/assets/demo/train.jsonl]" data.val_files="[$root/assets/demo/val.jsonl]" \
  reward_model.enable=true reward_model.model.path="$work/rm" trainer.total_training_steps=3 trainer.test_freq=-1 \
  trainer.save_freq=-1 trainer.val_before_train=false trainer.logger=[jsonl] data.train_batch_size=8 \
  trainer.rollout_data_dir="$work/rm_rollouts" trainer.default_local_dir="$work/rm_run" > "$work/rm_run.log" 2>&1
check "GRPO with a reward model runs" test $? -eq 0
check "the rewards are the reward model's scores" python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
rows = [json.loads(l) for l in open(w + "/rm_rollouts/1.jsonl")]
scores = [r["score"] for r in rows]
assert len(scores) == 64, len(scores)
assert len(set(round(s, 6) for s in scores)) > 10, scores[:10]  # continuous, not 0/1
assert any(s not in (0.0, 1.0) for s in scores)
m = [json.loads(l) for l in open(w + "/rm_run/metrics.jsonl")]
assert all(r["critic/score/mean"] == r["critic/score/mean"] for r in m)  # finite
print(f"step 1: {len(scores)} reward-model scores in [{min(scores):.3f}, {max(scores):.3f}]")
PY
grep -q "reward model: $work/rm (Qwen2ForSequenceClassification" "$work/rm_run.log"
check "the log names the reward model" test $? -eq 0

# The reference policy quantised to int4 (actor_rollout_ref.ref.quantization_bits): the KL term
# measures against it, so the KL loss is no longer zero on the first step.
ref_run() {
  OMP_NUM_THREADS=1 "$verl" train "$root/configs/demo.yaml" actor_rollout_ref.model.path="$root/assets/demo/model" \
    data.train_files="[$root/assets/demo/train.jsonl]" data.val_files="[$root/assets/demo/val.jsonl]" \
    actor_rollout_ref.actor.use_kl_loss=true trainer.total_training_steps=1 trainer.test_freq=-1 trainer.save_freq=-1 \
    trainer.val_before_train=false trainer.logger=[jsonl] data.train_batch_size=8 trainer.default_local_dir="$work/$1" \
    "${@:2}" > "$work/$1.log" 2>&1
}
ref_run ref16
ref_run ref4 actor_rollout_ref.ref.quantization_bits=4
check "GRPO with an int4 reference policy runs" test $? -eq 0
check "the int4 reference is reported" grep -q "reference policy: 16 linear matrices quantised to int4" "$work/ref4.log"
check "KL against the int4 reference > 0 at step 1, = 0 against the exact one" python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
kl = lambda d: [json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl")][0]["actor/kl_loss"]
print(f"actor/kl_loss at step 1: exact reference {kl('ref16'):.3g}, int4 reference {kl('ref4'):.3g}")
assert abs(kl("ref16")) < 1e-9 and kl("ref4") > 1e-6, (kl("ref16"), kl("ref4"))
PY
ref_run refodd actor_rollout_ref.ref.quantization_bits=4 actor_rollout_ref.ref.quantization_group_size=7
check "an odd int4 group size is an error" test $? -eq 1
check "... naming the key" grep -qF "actor_rollout_ref.ref.quantization_group_size=7: must be even" "$work/refodd.log"

echo "score: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
