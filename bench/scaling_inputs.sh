#!/usr/bin/env bash
# The single-GPU inputs of docs/scaling.md's projection: for the seed's Llama-3-8B (and Llama-2-13B)
# shape, the training step (forward + backward + AdamW) with 2 and 4 decoder layers (their
# difference / 2 is one layer's time; the rest is the embedding and LM head) and the rollout of the
# whole model at the sequences a GPU holds when a 1024-prompt step is spread over 8..64 GPUs. One
# JSON line per run in $OUT/scaling_inputs.jsonl; tools/scaling_projection.py turns them into the
# table.
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
  # A PPO step's 1024 prompts of 512 + 512 tokens spread over 8..64 GPUs: 128..16 sequences each.
  for prompts in 16 32 64 128; do
    "$verl" bench rollout --shape "$shape" --prompts $prompts --prompt-len 512 --new-tokens 512 \
      --gpu-memory-utilization 0.85 >> "$out" 2>> "$out.err" ||
      echo "# rollout $shape $prompts failed" >> "$out"
  done
done
