#!/usr/bin/env bash
# Runs the CPU training-step benchmark for verl.cpp and for PyTorch (Debian python3-torch) on the
# same shapes in one go and prints both JSON lines and the ratio.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${BUILD:-$root/build}/bin/bench_train_cpu
threads=${THREADS:-$(nproc)}
ours=$(OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads "$bin" "$@")
peer=$(/usr/bin/python3 "$root/tools/bench_train_torch.py" --threads "$threads" "$@")
echo "$ours"
echo "$peer"
python3 -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); print(json.dumps({'bench':'train_step_cpu','ratio_vs_pytorch': round(a['tokens_per_s']/b['tokens_per_s'],3)}))" "$ours" "$peer"
