#!/usr/bin/env bash
# One GPU call for docs/benchmarks.md's speed tables: test_cuda in full, then every row for one
# shape beside its peer (verl train, bench grpo-step + the TRL-style HF loop, bench train + HF eager
# and torch.compile, bench rollout + HF generate), then a CUPTI trace of the decode step. Runs on
# the GPU machine from binaries packed by tools/gpu_bundle.sh (carry out/gpu); writes
# $OUT/summary_TAG.txt and $OUT/raw_TAG.tgz (re-packed after every stage, so a call cut short
# still returns what finished).
#   bench/gpu_table.sh SHAPE TAG
# Environment: SFT=1 first runs `verl sft` on the demo model on cuda and on cpu (per-step losses
# side by side); SKIP_TEST=1 skips test_cuda; TRACE=0 skips the trace.
set -u
shape=$1; tag=$2
L=$(tools/gpu_bundle.sh --unpack | tail -1); export LD_LIBRARY_PATH=$L:${LD_LIBRARY_PATH:-}; export NCCL_NVLS_ENABLE=0
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
V=$PWD/out/gpu/bin/verl; export VERL=$V; export PYTHON=python3; verl=$V; python=python3; root=$PWD
S=$OUT/summary_$tag.txt
R=/tmp/raw_$tag; mkdir -p $R
stamp() { echo "$1 rc $2 $(( $(date +%s)-t )) s" >> $S; tar czf $OUT/raw_$tag.tgz -C /tmp raw_$tag; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv >> $S
if [ "${SFT:-0}" = 1 ]; then
# verl sft on the GPU against the CPU (the demo model, 20 steps of 16 rows): per-step losses.
for dev in cuda cpu; do
  t=$(date +%s); timeout 90 $V sft configs/demo/sft.yaml model.partial_pretrain=$PWD/assets/demo/model trainer.device=$dev \
    data.train_batch_size=16 trainer.total_training_steps=20 trainer.save_freq=10 trainer.logger=[jsonl] \
    trainer.default_local_dir=/tmp/sft_$dev > $R/sft_$dev.log 2>&1; stamp sft_$dev $?
  cp /tmp/sft_$dev/metrics.jsonl $R/sft_metrics_$dev.jsonl 2>/dev/null
done
python3 - $R/sft_metrics_cuda.jsonl $R/sft_metrics_cpu.jsonl >> $S 2>&1 <<'PY'
import json,sys
g=[json.loads(l) for l in open(sys.argv[1])]; c=[json.loads(l) for l in open(sys.argv[2])]
print('sft steps', len(g), len(c))
for a,b in zip(g,c):
    print('step', a['step'], 'loss cuda %.5f cpu %.5f rel %.2e' % (a['train/loss'], b['train/loss'], abs(a['train/loss']-b['train/loss'])/abs(b['train/loss'])), 'gnorm %.4f %.4f' % (a['train/grad_norm'], b['train/grad_norm']), 'tok/s %.0f %.0f' % (a['perf/throughput'], b['perf/throughput']))
PY
grep -E "SFT on|resum|saved" $R/sft_cuda.log | head -4 >> $S
fi
if [ "${SKIP_TEST:-0}" != 1 ]; then
t=$(date +%s); timeout 280 out/gpu/bin/test_cuda > $R/test_cuda_$tag.txt 2>&1; stamp test_cuda $?
grep -E "^\[  (PASSED|FAILED) |tests ran" $R/test_cuda_$tag.txt >> $S
fi
. bench/grpo_lib.sh
M=$(grpo_model $shape)
cfg=configs/examples/grpo_qwen2_5_0_5b_h200.yaml
t=$(date +%s); timeout 120 $V train $cfg actor_rollout_ref.model.path=$M trainer.default_local_dir=/tmp/run_$tag trainer.total_training_steps=5 > $R/train_$tag.log 2>&1; stamp verl_train $?
cp /tmp/run_$tag/metrics.jsonl $R/verl_train_metrics_$tag.jsonl 2>/dev/null
python3 - $R/verl_train_metrics_$tag.jsonl >> $S 2>&1 <<'PY'
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows=[r for r in rows if any(k.startswith('timing_s/') for k in r)]
use=rows[1:]
keys=sorted({k for r in use for k in r if k.startswith('timing_s/')})
print('verl_train steps', len(rows), 'mean of steps 2..:', {k[9:]: round(sum(r.get(k,0) for r in use)/len(use),3) for k in keys})
PY
t=$(date +%s); timeout 90 $V bench grpo-step $cfg actor_rollout_ref.model.path=$M trainer.default_local_dir=/tmp/g_$tag --warmup 1 --steps 3 > $R/grpo_$tag.json 2> $R/grpo_$tag.err; stamp grpo_step $?
t=$(date +%s); timeout 150 python3 tools/bench_grpo_hf.py --shape $shape --ref --steps 2 > $R/hf_grpo_$tag.json 2> $R/hf_grpo_$tag.err; stamp hf_grpo $?
python3 - $R/grpo_$tag.json $R/hf_grpo_$tag.json >> $S 2>&1 <<'PY'
import json,sys
for f in sys.argv[1:]:
    l=[x for x in open(f) if x.startswith('{')][-1]; d=json.loads(l)
    print(f.split('/')[-1], round(d['step_s'],3), {k: round(v,3) for k,v in d['phase_s'].items()}, 'tok/s', round(d.get('tokens_per_s',0)))
PY
t=$(date +%s); timeout 200 bench/train_cuda.sh $shape > $R/train_bench_$tag.jsonl 2> $R/train_bench_$tag.err; stamp train_cuda $?
tail -1 $R/train_bench_$tag.jsonl >> $S
t=$(date +%s); MODES=default timeout 120 bench/rollout_cuda.sh $shape > $R/rollout_$tag.jsonl 2> $R/rollout_$tag.err; stamp rollout_cuda $?
tail -1 $R/rollout_$tag.jsonl >> $S
grep -oE '"(decode_step_ms|bandwidth_fraction_of_peak)":[0-9.]*' $R/rollout_$tag.jsonl >> $S
if [ "${TRACE:-1}" = 1 ]; then
t=$(date +%s); CUDA_INJECTION64_PATH=$PWD/out/gpu/cupti_trace.so CUPTI_TRACE_OUT=/tmp/tr_$tag.tsv timeout 60 $V bench rollout --shape $shape > $R/rollout_traced_$tag.json 2>&1; stamp traced_rollout $?
python3 tools/cupti_summary.py /tmp/tr_$tag.tsv --graph-only --top 20 > $R/decode_profile_$tag.txt 2>&1
head -12 $R/decode_profile_$tag.txt | cut -c1-140 >> $S
fi
tar czf $OUT/raw_$tag.tgz -C /tmp raw_$tag
