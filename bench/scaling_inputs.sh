#!/usr/bin/env bash
# The single-GPU inputs of docs/scaling.md's projection: for the seed's Llama-3-8B (and Llama-2-13B)
# shape, the training step (forward + backward + AdamW) with 2 and 4 decoder layers (their
# difference / 2 is one layer's time; the rest is the embedding and LM head) and the rollout of the
# whole model. One JSON line per run in $OUT/scaling_inputs.jsonl; tools/scaling_projection.py
# turns them into the table.
#   bench/scaling_inputs.sh VERL_BINARY     (on the GPU machine; LD_LIBRARY_PATH set)
set -u
verl=$1
out=${OUT:-.}/scaling_inputs.jsonl
: > "$out"
nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/# /' >> "$out"
for shape in llama3-8b llama2-13b; do
  for layers in 2 4; do
    "$verl" bench train --shape "$shape" --layers "$layers" --batch 8 --seq 1024 --steps 5 \
      --warmup 2 >> "$out" 2>> "$out.err" || echo "# train $shape $layers failed" >> "$out"
  done
  "$verl" bench rollout --shape "$shape" --prompts 256 --prompt-len 256 --new-tokens 256 \
    --gpu-memory-utilization 0.85 >> "$out" 2>> "$out.err" || echo "# rollout $shape failed" >> "$out"
done
