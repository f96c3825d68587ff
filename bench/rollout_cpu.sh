#!/usr/bin/env bash
# CPU rollout benchmark: verl.cpp's engine (bench_rollout_cpu) and a PyTorch KV-cache sampling loop
# (tools/bench_rollout_torch.py, Debian python3-torch) on the same shapes; prints both and the ratio.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${BUILD:-$root/build}/bin/bench_rollout_cpu
threads=${THREADS:-$(nproc)}
ours=$(OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads "$bin" "$@")
peer=$(cd "$root/tools" && /usr/bin/python3 bench_rollout_torch.py --threads "$threads" "$@")
echo "$ours"
echo "$peer"
python3 -c "import json,sys; a=json.loads(sys.argv[1].splitlines()[0]); b=json.loads(sys.argv[2]); print(json.dumps({'bench':'rollout_cpu','ratio_vs_pytorch': round(a['output_tokens_per_s']/b['output_tokens_per_s'],3)}))" "$ours" "$peer"
