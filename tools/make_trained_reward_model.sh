#!/usr/bin/env bash
# A tiny reward model with trained weights: a causal LM of the score fixtures' shape
# (tests/fixtures/score/{llama,qwen2}_rm: hidden 64, 2 layers, the demo tokenizer's 512 ids) trained
# from random weights by `verl sft` for one epoch of assets/demo/sft.jsonl (configs/demo/sft.yaml,
# about 10 s on one core), then made a ...ForSequenceClassification with one label: the backbone
# kept, the LM head dropped, a score head of N(0, 1/hidden) weights from SEED.
# The random fixtures show how quantisation fares on weights with no structure; this one shows it on
# weights shaped by training, the case a reward model is in (docs/reward_model.md#quantisation).
#
#   tools/make_trained_reward_model.sh VERL llama|qwen2 OUT_DIR [SEED]
set -euo pipefail
verl=$1 arch=$2 out=$3 seed=${4:-7}
root=$(cd "$(dirname "$0")/.." && pwd)
case $arch in llama | qwen2) ;; *) echo "arch: want llama or qwen2, got $arch" >&2; exit 2 ;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$root/tests/fixtures/score/${arch}_rm/config.json" "$work/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["architectures"] = [c["architectures"][0].replace("ForSequenceClassification", "ForCausalLM")]
for k in ("num_labels", "id2label", "label2id"):
    c.pop(k, None)
c.update(eos_token_id=511, pad_token_id=509, bos_token_id=None, tie_word_embeddings=False)
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
"$verl" init-model --config "$work/config.json" --tokenizer "$root/assets/demo" --out "$work/init" --seed 1 >&2
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$verl" sft "$root/configs/demo/sft.yaml" \
  data.train_files="$root/assets/demo/sft.jsonl" model.partial_pretrain="$work/init" \
  trainer.default_local_dir="$work/sft" trainer.logging_steps=1000 > "$work/sft.log" 2>&1 ||
  { tail -5 "$work/sft.log" >&2; exit 1; }
sft=$(ls -d "$work"/sft/global_step_* | sort -t_ -k3 -n | tail -1)
mkdir -p "$out"
python3 - "$sft" "$out" "$seed" <<'PY'
import json, os, random, shutil, struct, sys
src, dst, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
for f in os.listdir(src):
    if f not in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(src, f), dst)
c = json.load(open(os.path.join(src, "config.json")))
c["architectures"] = [c["architectures"][0].replace("ForCausalLM", "ForSequenceClassification")]
c["num_labels"] = 1
json.dump(c, open(os.path.join(dst, "config.json"), "w"), indent=1)
raw = open(os.path.join(src, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
tensors, body = json.loads(raw[8:8 + n]), raw[8 + n:]
header, data = {}, bytearray()
for name, t in tensors.items():
    if name in ("__metadata__", "lm_head.weight"):
        continue
    b0, b1 = t["data_offsets"]
    header[name] = dict(t, data_offsets=[len(data), len(data) + b1 - b0])
    data += body[b0:b1]
h = c["hidden_size"]
rng = random.Random(seed)
head = struct.pack(f"<{h}f", *(rng.gauss(0.0, h ** -0.5) for _ in range(h)))
header["score.weight"] = {"dtype": "F32", "shape": [1, h], "data_offsets": [len(data), len(data) + len(head)]}
data += head
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(os.path.join(dst, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)
PY
echo "$out: ${arch} reward model, backbone trained by verl sft ($(basename "$sft")), score head seed $seed" >&2
