#!/usr/bin/env bash
# `verl doctor` (docs/doctor.md) as a user runs it: every line is a PASS / WARN / FAIL check, the
# machine checks pass or warn on a machine without a GPU, the pre-flight checklist names the key
# of each setting it warns about (and only those), --run judges a run's GPU utilisation against
# 85%, a FAIL gives exit 1, and bad input is an error naming the file or key.
# Usage: doctor.sh VERL_BINARY REPO_ROOT WORK_DIR
set -uo pipefail
verl=$1 root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=tests/e2e/lib.sh
. "$root/tests/e2e/lib.sh"
cd "$root" || exit 1  # configs/demo.yaml names its model and data relative to the repository
demo=configs/demo.yaml
checks='^(PASS|WARN|FAIL)  '
# warns_about FILE KEY: some WARN line of FILE names KEY.
warns_about() { grep -E '^WARN' "$1" | grep -qF "$2"; }

# The machine: exit 0 here, at least 8 checks, nothing but check lines on stdout.
"$verl" doctor > "$work/machine.txt" 2> "$work/machine.err"
check "doctor exits 0" test $? -eq 0
check "doctor prints >= 8 checks" test "$(grep -cE "$checks" "$work/machine.txt")" -ge 8
check "every line is a check" test "$(grep -cvE "$checks" "$work/machine.txt")" -eq 0
for name in build gpus mpi launcher interconnect "host memory" disk "blas threads"; do
  check "a '$name' check" grep -qE "^(PASS|WARN|FAIL)  $name " "$work/machine.txt"
done
# Without a GPU the GPU check warns that training runs on the CPU (a GPU machine passes it).
check "gpus passes, or warns naming trainer.device=cpu" \
  grep -qE '^(PASS  gpus |WARN  gpus .*training runs on the CPU \(trainer\.device=cpu\))' "$work/machine.txt"
# --dir is where the disk check looks.
"$verl" doctor --dir "$work" > "$work/dir.txt"
check "--dir is the disk check's directory" grep -qE "^(PASS|WARN)  disk .* at $work" "$work/dir.txt"

# The checklist on settings that cost: each warning names its key.
"$verl" doctor --config $demo trainer.save_freq=1 trainer.logging_steps=1 data.dataloader_num_workers=0 \
  > "$work/bad.txt" 2> "$work/bad.err"
check "doctor --config with costly settings exits 0 (warnings only)" test $? -eq 0
check "the config checks follow the machine's" test "$(grep -cE "$checks" "$work/bad.txt")" -ge 20
for key in trainer.save_freq trainer.logging_steps data.dataloader_num_workers; do
  check "warns about $key" warns_about "$work/bad.txt" "$key"
done
check "save_freq=1 suggests a value" grep -qE '^WARN  trainer\.save_freq .*consider trainer\.save_freq=[0-9]+' "$work/bad.txt"
check "the demo's run length is 100 steps" grep -qE '^PASS  run length +100 steps' "$work/bad.txt"
# The same config without those problems: those keys pass and appear in no WARN line.
"$verl" doctor --config $demo trainer.save_freq=50 trainer.logging_steps=10 data.dataloader_num_workers=2 \
  > "$work/good.txt" 2> "$work/good.err"
check "doctor --config good exits 0" test $? -eq 0
for key in trainer.save_freq trainer.logging_steps data.dataloader_num_workers; do
  check "passes $key" grep -qE "^PASS  $key " "$work/good.txt"
  check "no warning names $key" bash -c "! grep -E '^WARN' '$work/good.txt' | grep -qF '$key'"
done

# data.dynamic_batch: its budget when on (demo: 64 x (32 + 24) tokens under the 8192 cap); a
# minimum over the maximum fails naming both keys.
"$verl" doctor --config $demo data.dynamic_batch.enable=true > "$work/dyn.txt" 2> "$work/dyn.err"
check "dynamic_batch on passes with its budget" \
  grep -qE '^PASS  data\.dynamic_batch\.enable .*micro-batches of up to 3584 tokens' "$work/dyn.txt"
"$verl" doctor --config $demo data.dynamic_batch.enable=true data.dynamic_batch.min_sequence_length=5000 \
  > "$work/dyn_bad.txt" 2> "$work/dyn_bad.err"
check "min_sequence_length > max_sequence_length fails (exit 1)" test $? -eq 1
check "the failure names both keys" grep -qE \
  '^FAIL  data\.dynamic_batch\.enable .*min_sequence_length \(5000\) must not exceed data\.dynamic_batch\.max_sequence_length \(4096\)' \
  "$work/dyn_bad.txt"
# A missing training file is a FAIL naming it, and exit 1.
"$verl" doctor --config $demo data.train_files=[/nonexistent/train.jsonl] > "$work/nodata.txt" 2>&1
check "a missing data file exits 1" test $? -eq 1
check "a missing data file FAILs naming it" grep -qE '^FAIL  data\.train_files .*/nonexistent/train\.jsonl' "$work/nodata.txt"

# reward_model.model.input_tokenizer: a reward model with the policy's own tokenizer and template
# (init-model copies the demo's) warns naming the key and null; null passes; another template passes.
demo_reward_model "$work/rm"
rm_args=(reward_model.enable=true reward_model.model.path="$work/rm")
"$verl" doctor --config $demo "${rm_args[@]}" > "$work/rm_same.txt" 2>&1
check "a reward model with the policy's tokenizer warns naming input_tokenizer=null" \
  grep -qE '^WARN  reward_model\.model\.input_tokenizer .*policy.s tokenizer and chat template.*input_tokenizer=null' "$work/rm_same.txt"
"$verl" doctor --config $demo "${rm_args[@]}" reward_model.model.input_tokenizer=null > "$work/rm_null.txt" 2>&1
check "input_tokenizer=null passes" grep -qE '^PASS  reward_model\.model\.input_tokenizer +null' "$work/rm_null.txt"
cp -r "$work/rm" "$work/rm_other"
python3 - "$work/rm_other/tokenizer_config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["chat_template"] = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
json.dump(c, open(sys.argv[1], "w"))
PY
"$verl" doctor --config $demo reward_model.enable=true reward_model.model.path="$work/rm_other" > "$work/rm_other.txt" 2>&1
check "a reward model with its own template passes (the re-render)" \
  grep -qE "^PASS  reward_model\.model\.input_tokenizer .*re-rendered with .*rm_other's chat template" "$work/rm_other.txt"

# A finished run: mean perf/gpu_util_mean against 85%.
mkdir -p "$work/run_low" "$work/run_high" "$work/run_cpu"
for s in 1 2 3; do
  echo "{\"step\": $s, \"perf/gpu_util_mean\": 40.0, \"timing_s/step\": 2.0, \"timing_s/gen\": 1.5, \"timing_s/reward\": 0.2}"
done > "$work/run_low/metrics.jsonl"
printf '{"step": 1, "perf/gpu_util_mean": 90.0}\n{"step": 2, "perf/gpu_util_mean": 96.0}\n' > "$work/run_high/metrics.jsonl"
printf '{"step": 1, "timing_s/step": 1.0}\n' > "$work/run_cpu/metrics.jsonl"
"$verl" doctor --run "$work/run_low" > "$work/run_low.txt"
check "--run at 40% warns naming 85%" grep -qE '^WARN  gpu utilisation .*averages 40\.0% over 3 steps.*85%' "$work/run_low.txt"
check "--run names the longest stage" grep -qE '^WARN  gpu utilisation .*timing_s/gen takes 75%' "$work/run_low.txt"
"$verl" doctor --run "$work/run_high" > "$work/run_high.txt"
check "--run at 93% passes" grep -qE '^PASS  gpu utilisation .*averages 93\.0%' "$work/run_high.txt"
"$verl" doctor --run "$work/run_cpu" > "$work/run_cpu.txt"
check "--run without the metric says so" grep -qE '^WARN  gpu utilisation .*perf/gpu_util_mean absent' "$work/run_cpu.txt"

# The environment: a torchrun-style launch without MASTER_ADDR FAILs (exit 1); a bad thread count warns.
env RANK=0 WORLD_SIZE=2 "$verl" doctor > "$work/torchrun.txt" 2>&1
check "a launch missing MASTER_ADDR exits 1" test $? -eq 1
check "a launch missing MASTER_ADDR FAILs naming it" grep -qE '^FAIL  launcher .*MASTER_ADDR' "$work/torchrun.txt"
env OMP_NUM_THREADS=many "$verl" doctor > "$work/omp.txt" 2>&1
check "a bad OMP_NUM_THREADS warns" grep -qE "^WARN  blas threads .*OMP_NUM_THREADS='many' is not a thread count" "$work/omp.txt"

# Bad input: exit 1 with a message naming the file or key, never a crash.
"$verl" doctor --config "$work/missing.yaml" > /dev/null 2> "$work/err_config.txt"
check "a missing --config exits 1" test $? -eq 1
check "a missing --config is named" grep -qF "$work/missing.yaml" "$work/err_config.txt"
"$verl" doctor --config $demo trainer.save_frequency=5 > /dev/null 2> "$work/err_key.txt"
check "an unknown key exits 1" test $? -eq 1
check "an unknown key is named" grep -qF "trainer.save_frequency" "$work/err_key.txt"
"$verl" doctor --run "$work/no_such_run" > /dev/null 2> "$work/err_run.txt"
check "a missing --run exits 1" test $? -eq 1
check "a missing --run is named" grep -qF "$work/no_such_run" "$work/err_run.txt"
printf '{"step": 1}\nnot json\n' > "$work/run_cpu/metrics.jsonl"
"$verl" doctor --run "$work/run_cpu" > /dev/null 2> "$work/err_json.txt"
check "a bad metrics line exits 1" test $? -eq 1
check "a bad metrics line is named" grep -qF "$work/run_cpu/metrics.jsonl:2" "$work/err_json.txt"
"$verl" doctor trainer.save_freq=5 > /dev/null 2> "$work/err_noconfig.txt"
check "overrides without --config exit 1" test $? -eq 1
check "overrides without --config say so" grep -qF "give --config CONFIG" "$work/err_noconfig.txt"

echo "doctor: $pass passed, $fail failed"
test "$fail" -eq 0
