#!/usr/bin/env bash
# ListOps at a CPU budget, every mechanism with a row in LRA Table 1 (and nystromformer), seeds 0 and 1:
# the model of the Nyströmformer setting (2 layers, d 64, 2 heads of 32, FF 128 GELU, pre-norm, learned
# positions, mean pooling, dropout 0.1) on trees of 64-256 tokens, 400 steps of batch 16, Adam 1e-3 with
# 40 warm-up steps and cosine decay, one thread; scored on 640 test examples. Each mechanism's sparsity is
# scaled to the 256-token sequences (the options below). Resumable: a mechanism whose sweep directory
# already holds both seeds' result.json is skipped.
# Usage: PYTHON=.venv/bin/python results/lra_family/run_listops.sh <out-dir> [mechanism ...]
set -euo pipefail
OUT=${1:?out dir}; shift
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python}
declare -A OPTIONS=(
  [vanilla]=""
  [local_1d]="attention.block=32 attention.memory=32"
  [sparse_fixed]="attention.stride=32 attention.c=8"
  [longformer]="attention.window=32 attention.global_tokens=1"
  [linformer]="attention.k=64 attention.max_len=256"
  [lsh]=""
  [sinkhorn]="attention.block=32 attention.max_len=256"
  [synthesizer]="attention.max_len=256"
  [bigbird]="attention.block=16 attention.random_blocks=3"
  [linear]=""
  [performer]="attention.n_features=256"
  [nystromformer]="attention.landmarks=32 attention.conv_kernel=35"
)
MECHANISMS=${*:-vanilla local_1d sparse_fixed longformer linformer lsh sinkhorn synthesizer bigbird linear performer nystromformer}
COMMON=(experiment=lra_listops trainer.seq_len=256 data.min_length=64 data.max_length=256
        model.n_layers=2 model.d_model=64 model.n_heads=2 model.d_ff=128 model.activation=gelu model.max_len=256
        model.dropout=0.1 model.attention_dropout=0.1 position=learned residual=pre_norm
        optim=adam optim.lr=1e-3 optim.schedule=cosine optim.warmup=40 optim.weight_decay=0.0
        trainer.batch_size=16 trainer.max_steps=400 trainer.eval_every=0 trainer.eval_split=test trainer.eval_batches=40
        trainer.threads=1 trainer.progress=false trainer.checkpoints=false trainer.device=cpu logger=csv seed=0,1)
for mech in $MECHANISMS; do
  dir="$OUT/$mech"
  if [ "$(find "$dir" -name result.json 2>/dev/null | wc -l)" -ge 2 ]; then echo "skip $mech (done)"; continue; fi
  rm -rf "$dir"
  echo "$(date -u +%H:%M:%S) $mech (load $(cut -d' ' -f1-3 /proc/loadavg))"
  # shellcheck disable=SC2086
  PYTHONPATH=$ROOT OMP_NUM_THREADS=1 $PY "$ROOT/experiments/train.py" -m "${COMMON[@]}" attention=$mech ${OPTIONS[$mech]} \
    "hydra.sweep.dir=$dir"
done
echo "$(date -u +%H:%M:%S) done (load $(cut -d' ' -f1-3 /proc/loadavg))"
