#!/usr/bin/env bash
# Hostile input, third round (issue 41), end to end on the demo model: strangers on MASTER_PORT
# while a 2-rank TCP job starts (an HTTP client and a silent connection at rank 0; an echo service
# where rank 1 expects rank 0), ranks started with different configurations (mpirun's MPMD `:`
# gives rank 1 its own lr), a rank whose trainer.default_local_dir is another directory (the
# checkpoint is not published), NaN where a number must be finite, model-writing commands over an
# existing directory, and the messages of the poor-message list (an unknown subcommand, `verl
# train` without a config, RANK without WORLD_SIZE, MASTER_PORT=abc or 0, a duplicated YAML key,
# grpoo, a 20-digit integer, doctor on a directory and on a reward model whose tokenizer outgrows
# it, an init-model config too large for the machine).
# Usage: hostile.sh VERL_BINARY REPO_ROOT WORK_DIR
set -uo pipefail
verl=$1 root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=tests/e2e/lib.sh
. "$root/tests/e2e/lib.sh"
common=("${demo_dp[@]}" trainer.total_training_steps=1 trainer.test_freq=-1)
demo="$root/assets/demo/model"
# has FILE TEXT: FILE holds TEXT (fixed string).
has() { grep -qF -- "$2" "$1"; }

# --- 1. The TCP bootstrap with strangers on MASTER_PORT -----------------------------------------
# Rank 0 starts; an HTTP client asks it for /health and is refused (named in rank 0's log); a
# silent connection stays open; then rank 1 joins and the job trains its step.
port=$((20000 + $$ % 20000))
tcp_rank() {
  RANK=$1 WORLD_SIZE=2 LOCAL_RANK=$1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
    timeout 300 "$verl" train "$root/configs/demo.yaml" "${common[@]}" trainer.n_gpus_per_node=2 \
    trainer.default_local_dir="$work/tcp" trainer.save_freq=-1 > "$work/tcp.$1.log" 2>&1
}
tcp_rank 0 &
pid0=$!
python3 - "$port" "$work/strangers.ready" > "$work/strangers.log" 2>&1 <<'PY' &
import socket, sys, time
port = int(sys.argv[1])
def connect():
    for _ in range(600):
        try:
            return socket.create_connection(("127.0.0.1", port))
        except OSError:
            time.sleep(0.05)
    raise SystemExit("rank 0 never listened")
http = connect()
http.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
http.settimeout(30)
print("http client closed by rank 0:", http.recv(100) == b"")
silent = connect()
open(sys.argv[2], "w").close()  # rank 1 may come now
silent.settimeout(120)
print("silent connection closed by rank 0:", silent.recv(100) == b"")
PY
spid=$!
for _ in $(seq 1200); do [ -e "$work/strangers.ready" ] && break; sleep 0.05; done  # strangers first
tcp_rank 1
rc1=$?
wait $pid0
rc0=$?
wait $spid
check "TCP job with strangers on MASTER_PORT trains (rc $rc0 $rc1)" test "$rc0$rc1" = 00
check "rank 0 names the HTTP client it refused" has "$work/tcp.0.log" "it is not a verl rank (it sent 'GET /health HTTP/1.1"
check "the strangers are closed, not served" has "$work/strangers.log" "silent connection closed by rank 0: True"
check "the step was trained" test -s "$work/tcp/metrics.jsonl"

# Rank 1 whose MASTER_PORT is an echo service: named, not read as collective sizes.
python3 - "$work/echo.port" > /dev/null 2>&1 <<'PY' &
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
c, _ = s.accept()
c.settimeout(30)
while True:
    b = c.recv(4096)
    if not b:
        break
    c.sendall(b)
PY
epid=$!
for _ in $(seq 100); do [ -s "$work/echo.port" ] && break; sleep 0.05; done
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(cat "$work/echo.port") OMP_NUM_THREADS=1 timeout 120 \
  "$verl" train "$root/configs/demo.yaml" "${common[@]}" trainer.n_gpus_per_node=2 \
  trainer.default_local_dir="$work/echo" > "$work/echo.log" 2>&1
check "a rank at an echo service exits 1" test $? -eq 1
check "the echo service is named" has "$work/echo.log" "is not rank 0 of a verl job: it sent this rank's own hello back (an echo service?)"
kill "$epid" 2> /dev/null
wait "$epid" 2> /dev/null

# --- 2. Ranks that run different configurations -------------------------------------------------
# mpirun's MPMD form gives rank 1 its own arguments: here another learning rate. mpmd LOG DIR0
# DIR1 [rank 1's overrides]: both ranks also take the overrides in the array `both`.
both=()
mpmd() {
  local log=$1 dir0=$2 dir1=$3
  shift 3
  timeout 300 mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 \
    -np 1 "$verl" train "$root/configs/demo.yaml" "${common[@]}" trainer.n_gpus_per_node=2 \
    trainer.default_local_dir="$dir0" "${both[@]}" : \
    -np 1 "$verl" train "$root/configs/demo.yaml" "${common[@]}" trainer.n_gpus_per_node=2 \
    trainer.default_local_dir="$dir1" "${both[@]}" "$@" > "$log" 2>&1
}
both=(trainer.logger=[jsonl,wandb])  # a config warning, printed by rank 0 alone
mpmd "$work/lr.log" "$work/lr" "$work/lr" actor_rollout_ref.actor.optim.lr=2e-4
check "a rank with another lr stops the job" test $? -ne 0
check "a config warning is printed once, by rank 0" test "$(grep -c "entry 'wandb' is not available" "$work/lr.log")" = 1
both=()
check "the differing key is named with each rank's value" has "$work/lr.log" \
  "actor_rollout_ref.actor.optim.lr: 0.0001 on rank 0, 0.0002 on rank 1"
check "nothing was trained" test ! -e "$work/lr/metrics.jsonl"
mpmd "$work/n.log" "$work/n" "$work/n" actor_rollout_ref.rollout.n=2 data.seed=5
check "another rollout.n and data.seed: both named" bash -c "grep -qF 'actor_rollout_ref.rollout.n: 4 on rank 0, 2 on rank 1' '$work/n.log' && grep -qF 'data.seed: null on rank 0, 5 on rank 1' '$work/n.log'"

# --- 3. A rank whose trainer.default_local_dir is another directory -----------------------------
# ZeRO-1: each rank writes its own optimizer shard. Rank 1's lands in its own directory, so rank 0
# must not publish global_step_1 (nor move the tracker) without it.
both=(actor_rollout_ref.actor.zero_stage=1 trainer.save_freq=1)
mpmd "$work/ckpt.log" "$work/ckpt0" "$work/ckpt1"
check "a checkpoint missing a rank's shard stops the job" test $? -ne 0
check "the rank, its directory and the file are named" has "$work/ckpt.log" \
  "checkpoint step 1 not published: rank 1 wrote actor/optim_world_size_2_rank_1.safetensors into $work/ckpt1/.tmp_global_step_1"
check "no checkpoint published" test ! -e "$work/ckpt0/global_step_1"
check "no tracker written" test ! -e "$work/ckpt0/latest_checkpointed_iteration.txt"

# --- 4. NaN where a number must be finite --------------------------------------------------------
"$verl" train "$root/configs/demo.yaml" "${common[@]}" trainer.default_local_dir="$work/nan" \
  actor_rollout_ref.actor.optim.lr=.nan > "$work/nan.log" 2>&1
check "lr=.nan exits 1" test $? -eq 1
check "lr=.nan is named" has "$work/nan.log" "actor_rollout_ref.actor.optim.lr = .nan is not a finite number"
check "lr=.nan trains nothing" test ! -e "$work/nan/metrics.jsonl"

# --- 5. Model-writing commands over an existing directory ----------------------------------------
"$verl" init-model --config "$demo/config.json" --tokenizer "$demo" --out "$work/m" --seed 1 > /dev/null 2>&1
check "init-model writes a new directory" test -s "$work/m/model.safetensors"
sum=$(md5sum < "$work/m/model.safetensors")
"$verl" init-model --config "$demo/config.json" --out "$work/m" --seed 2 > /dev/null 2> "$work/ow.err"
check "init-model over a model exits 1" test $? -eq 1
check "init-model names the target and --overwrite" has "$work/ow.err" \
  "--out $work/m is not empty (it holds config.json, model.safetensors, tokenizer.json, tokenizer_config.json): pass --overwrite"
check "the model is untouched" test "$(md5sum < "$work/m/model.safetensors")" = "$sum"
"$verl" init-model --config "$demo/config.json" --out "$work/m" --seed 2 --overwrite > /dev/null 2>&1
check "--overwrite replaces it" test "$(md5sum < "$work/m/model.safetensors")" != "$sum"
check "--overwrite leaves no stale tokenizer files" test ! -e "$work/m/tokenizer.json"
check "no staging directory is left" bash -c "! ls -a '$work' | grep -q '^\.m\.'"
"$verl" convert --model "$demo" --out "$work/m" > /dev/null 2> "$work/cv.err"
check "convert over a model exits 1 naming it" has "$work/cv.err" "--out $work/m is not empty"
mkdir -p "$work/empty"
"$verl" convert --model "$demo" --out "$work/empty" > /dev/null 2>&1
check "convert into an empty directory writes it" test -s "$work/empty/model.safetensors"
mkdir -p "$work/ck/actor" && cp -r "$demo" "$work/ck/actor/huggingface"
"$verl" export "$work/ck" "$work/empty" > /dev/null 2> "$work/ex.err"
check "export over a model exits 1 naming it" has "$work/ex.err" "the output directory $work/empty is not empty"

# --- 6. Messages that used to mislead or say nothing ---------------------------------------------
# err NAME TEXT COMMAND...: COMMAND exits 1 and its output holds TEXT.
err() {
  local name=$1 text=$2
  shift 2
  "$@" > "$work/msg.txt" 2>&1
  local rc=$?
  check "$name exits 1 (rc $rc)" test "$rc" -eq 1
  check "$name: '$text'" has "$work/msg.txt" "$text"
}
err "an unknown subcommand" "'trian' is not a verl subcommand (did you mean 'train'?)" "$verl" trian
err "verl train without a config" "no config file given, and actor_rollout_ref.model.path is verl's placeholder default" \
  "$verl" train trainer.total_epochs=1
err "verl sft without a config" "no config file given, and model.partial_pretrain is the placeholder default" \
  "$verl" sft trainer.total_epochs=1
err "RANK without WORLD_SIZE" "RANK=0 is set but WORLD_SIZE is not" env RANK=0 "$verl" train "$root/configs/demo.yaml" "${common[@]}"
err "MASTER_PORT=abc" "MASTER_PORT='abc' is not a TCP port: a number in 1..65535" \
  env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=abc "$verl" train "$root/configs/demo.yaml" "${common[@]}"
err "MASTER_PORT=0" "MASTER_PORT='0' is not a TCP port" \
  env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=0 "$verl" train "$root/configs/demo.yaml" "${common[@]}"
printf 'trainer:\n  total_epochs: 2\n  total_epochs: 3\n' > "$work/dup.yaml"
err "a key twice in a YAML file" "dup.yaml:3: trainer.total_epochs appears twice in one mapping (first at $work/dup.yaml:2)" \
  "$verl" config "$work/dup.yaml"
err "adv_estimator=grpoo" "did you mean 'grpo'?" "$verl" config algorithm.adv_estimator=grpoo
err "a 20-digit integer" "data.seed = 12345678901234567890 is an integer too large for 64 bits" \
  "$verl" config data.seed=12345678901234567890
(cd "$root" && "$verl" doctor --config configs/demo.yaml data.train_files="[$root/assets/demo]") > "$work/doc_dir.txt" 2>&1
check "doctor calls a directory a directory" has "$work/doc_dir.txt" "$root/assets/demo: a directory, not a data file"
(cd "$root" && "$verl" doctor --config configs/demo.yaml data.max_response_length=200) > "$work/doc_len.txt" 2>&1
check "doctor warns of lengths past max_position_embeddings" grep -qE \
  "^WARN  data.max_response_length .*= 232 tokens; the model's max_position_embeddings is 128" "$work/doc_len.txt"
# A reward model whose tokenizer has more ids than its embedding rows: doctor FAILs naming both.
python3 - "$demo/config.json" "$work/rm_small.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(architectures=["Qwen2ForSequenceClassification"], num_labels=1, vocab_size=64)
json.dump(c, open(sys.argv[2], "w"))
PY
"$verl" init-model --config "$work/rm_small.json" --out "$work/rm_small" > /dev/null 2>&1
cp "$demo"/tokenizer*.json "$work/rm_small/"
(cd "$root" && "$verl" doctor --config configs/demo.yaml reward_model.enable=true reward_model.model.path="$work/rm_small") > "$work/doc_rm.txt" 2>&1
check "doctor FAILs a reward model whose tokenizer outgrows it" grep -qE \
  "^FAIL  reward_model.model.input_tokenizer .*rm_small/tokenizer.json has [0-9]+ token ids, but the reward model's config.json vocab_size is 64" "$work/doc_rm.txt"
# The same for the policy: a tokenizer with more ids than the model's rows is named up front.
(cd "$root" && "$verl" doctor --config configs/demo.yaml actor_rollout_ref.model.path="$work/rm_small") > "$work/doc_tok.txt" 2>&1
check "doctor FAILs a policy whose tokenizer outgrows it" grep -qE \
  "^FAIL  data.tokenizer .*rm_small: [0-9]+ token ids; the model's vocab_size is 64" "$work/doc_tok.txt"
# A model too large for the machine is named as such, not as a KV-cache budget (a 4 GB address
# space makes the allocation fail at once).
python3 - "$demo/config.json" "$work/huge.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(hidden_size=65536, intermediate_size=262144, num_hidden_layers=512, num_attention_heads=512, num_key_value_heads=512)
json.dump(c, open(sys.argv[2], "w"))
PY
err "an oversized init-model config" "does not fit in this machine's memory (fp32 weights)" \
  bash -c 'ulimit -v 4000000; exec "$0" init-model --config "$1" --out "$2"' "$verl" "$work/huge.json" "$work/huge"

echo "hostile: $pass passed, $fail failed"
[ "$fail" = 0 ]
