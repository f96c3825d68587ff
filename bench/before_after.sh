#!/usr/bin/env bash
# Two builds of verl.cpp side by side in one GPU call, for a change that must leave the GPU path's
# results and speed alone (issue 38: within 3%, log-probs unchanged): test_cuda in full from each
# (the rollout-vs-trainer log-prob lines kept), then `verl bench grpo-step` on
# configs/examples/grpo_qwen2_5_0_5b_h200.yaml, `verl bench rollout` and `verl bench train` at the
# 0.5B shape, the two builds alternating ROUNDS times (default 2) so drift hits both alike.
# Writes $OUT/before_after.txt (a summary) and $OUT/before_after_raw.tgz.
#   bench/before_after.sh DIR_A DIR_B     (each packed by tools/gpu_bundle.sh: bin/*.xz, deblibs.tar.xz)
# Environment: SKIP_TEST=1 skips test_cuda, ROUNDS=0 the benchmarks (a call is at most 10 minutes:
# test_cuda twice and two rounds of benchmarks take about as long, so they may go in two calls).
set -u
A=$1; B=$2; rounds=${ROUNDS:-2}
root=$PWD; export NCCL_NVLS_ENABLE=0
# The test binaries read fixtures under the source path they were built in (FIXTURE_PATHS, default
# /work/main): each is made a link to this tree.
for p in ${FIXTURE_PATHS:-/work/main}; do
  [ -e "$p" ] || { mkdir -p "$(dirname "$p")" && ln -s "$PWD" "$p"; }
done
for d in "$A" "$B"; do
  mkdir -p "$d/lib" && tar -xJf "$d/deblibs.tar.xz" -C "$d"
  for f in "$d"/bin/*.xz; do xz -dkf "$f" && chmod +x "${f%.xz}"; done
done
export LD_LIBRARY_PATH=$root/$A/lib:${LD_LIBRARY_PATH:-}
S=$OUT/before_after.txt; R=/tmp/before_after; mkdir -p $R
pack() { tar czf $OUT/before_after_raw.tgz -C /tmp before_after; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $S
python=python3; verl=$root/$A/bin/verl
. bench/grpo_lib.sh
[ "$rounds" = 0 ] || M=$(grpo_model qwen2.5-0.5b) || { echo "no model" >> $S; exit 1; }
cfg=configs/examples/grpo_qwen2_5_0_5b_h200.yaml
tag() { basename "$1"; }
if [ "${SKIP_TEST:-0}" != 1 ]; then
  for d in "$A" "$B"; do
    t=$(date +%s); timeout 280 $d/bin/test_cuda > $R/test_cuda_$(tag $d).txt 2>&1
    echo "test_cuda $(tag $d): rc $? $(( $(date +%s) - t )) s; $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ tests?' $R/test_cuda_$(tag $d).txt | tr '\n' ' ')" >> $S
    grep -E 'rollout vs trainer' $R/test_cuda_$(tag $d).txt | sed "s/^/  $(tag $d): /" >> $S
    grep -E '^\[  FAILED  \] [A-Z]' $R/test_cuda_$(tag $d).txt | sed "s/^/  $(tag $d): /" >> $S
    pack
  done
fi
for r in $(seq 1 "$rounds"); do
  for d in "$A" "$B"; do
    v=$root/$d/bin/verl; n=$(tag $d)_$r
    timeout 120 $v bench grpo-step $cfg actor_rollout_ref.model.path=$M trainer.default_local_dir=/tmp/g_$n \
      --warmup 1 --steps 3 > $R/grpo_$n.json 2> $R/grpo_$n.err
    echo "grpo-step $n rc $?: $(grep '^{' $R/grpo_$n.json | tail -1 | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(round(d["step_s"],4), {k: round(x,4) for k,x in d["phase_s"].items()})' 2>&1)" >> $S
    timeout 120 $v bench rollout --shape qwen2.5-0.5b > $R/rollout_$n.json 2> $R/rollout_$n.err
    echo "rollout $n rc $?: $(grep -oE '"(output_tokens_per_s|decode_step_ms)":[0-9.]*' $R/rollout_$n.json | tr '\n' ' ')" >> $S
    timeout 120 $v bench train --device cuda --shape qwen2.5-0.5b > $R/train_$n.json 2> $R/train_$n.err
    echo "train $n rc $?: $(grep -oE '"(tokens_per_s|peak_memory_bytes|mfu)":[0-9.]*' $R/train_$n.json | tr '\n' ' ')" >> $S
    pack
  done
done
