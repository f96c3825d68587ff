#!/usr/bin/env bash
# The GPU checks the CPU machine cannot run, in the order a short device call should run them, each
# with its own time limit so that one slow part does not take the rest's output with it. Run from
# the repository root on the GPU machine after `tools/gpu_bundle.sh` (here) and with the bundle
# carried (out/gpu); writes $OUT/gpu_checks/<part>.txt and a summary on stdout.
#   bench/gpu_checks.sh [PART ...]
# Parts (default: tests mpi): tests (test_cuda: LoRA and multi-turn first, then the rest), mpi
# (test_cuda_mpi at -np 2 and 4: staged communicator, ZeRO 1/2 on the CUDA state), zero (`NP=2
# PARTS=zero bench/multi_gpu_cuda.sh`: ZeRO 1/2 against 0 over 3 GRPO steps, per-rank memory
# against RunPlan), lora (bench/lora_gpu.sh qwen2.5-7b: acceptance 5 of issue 39), scaling
# (bench/scaling_inputs.sh: docs/scaling.md's inputs).
set -u
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(tests mpi)
export NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=1
lib=$(tools/gpu_bundle.sh --unpack)
export LD_LIBRARY_PATH=$lib:${LD_LIBRARY_PATH:-}
# The test binaries read fixtures under the source path they were built in.
for p in ${FIXTURE_PATHS:-/work/main}; do
  [ -e "$p" ] || { mkdir -p "$(dirname "$p")" && ln -s "$PWD" "$p"; }
done
bin=$PWD/out/gpu/bin
res=${OUT:-out}/gpu_checks
mkdir -p "$res"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$res/gpu.txt"
# timed NAME LIMIT CMD...: runs CMD with a limit, its output in NAME.txt, then its rc and seconds.
timed() {
  local name=$1 limit=$2 t0
  shift 2
  t0=$(date +%s)
  timeout "$limit" "$@" > "$res/$name.txt" 2>&1
  echo "rc=$? seconds=$(($(date +%s) - t0))" >> "$res/$name.txt"
  echo "== $name"
  grep -E "^\[  (PASSED|FAILED) |tests ran|^(PASS|FAIL)|rc=" "$res/$name.txt" | tail -8
}
for part in "${parts[@]}"; do
  case $part in
    tests)
      timed test_cuda_new 200 "$bin/test_cuda" --gtest_filter='*Lora*:*MultiTurn*'
      timed test_cuda_rest 300 "$bin/test_cuda" --gtest_filter='-*Lora*:*MultiTurn*' ;;
    mpi)
      for np in 2 4; do
        timed "test_cuda_mpi_np$np" 120 mpirun --allow-run-as-root --oversubscribe -np "$np" \
          -x OMP_NUM_THREADS -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH "$bin/test_cuda_mpi"
      done ;;
    zero) VERL=$bin/verl NP=2 PARTS=zero timed zero_np2 300 bench/multi_gpu_cuda.sh ;;
    lora) VERL=$bin/verl timed lora_gpu 560 bench/lora_gpu.sh qwen2.5-7b ;;
    scaling) OUT=$res timed scaling 560 bench/scaling_inputs.sh "$bin/verl" ;;
    *) echo "gpu_checks.sh: unknown part '$part'" >&2 ;;
  esac
done
tar czf "${OUT:-out}/gpu_checks.tgz" -C "$(dirname "$res")" "$(basename "$res")"
