#!/usr/bin/env bash
# CPU-scale Long Range Arena runs behind results/lra/ (see README.md there): one small model
# (2 layers, d = 64, 4 heads, d_ff = 128) per mechanism, short sequences (ListOps 256, Text 512,
# Image 1024), 150-250 steps of batch 4-8, one thread: a 2-core machine shared by 8 jobs.
# Usage: IMDB=<aclImdb tarball> CIFAR_DIR=<cifar-10-batches-py> results/lra/run_cpu.sh <out-dir> [task ...]
# (tasks: listops text image; ATTENTIONS=a,b and SUFFIX=_x run a subset into <out-dir>/<task>_x)
set -euo pipefail
OUT=${1:?out dir}; shift
TASKS=${*:-listops text image}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python}
COMMON=("attention=${ATTENTIONS:-vanilla,local_1d,sparse_fixed,lsh}" model.d_model=64 model.n_layers=2 model.n_heads=4 model.d_ff=128
        model.dropout=0.0 model.attention_dropout=0.0 optim=adam optim.lr=1e-3 optim.schedule=cosine optim.warmup=40 optim.weight_decay=0.0
        trainer.eval_every=0 trainer.eval_split=test trainer.eval_batches=40
        trainer.threads=1 trainer.progress=false trainer.checkpoints=false trainer.device=cpu logger=csv)
for task in $TASKS; do
  case $task in
    listops) extra=(experiment=lra_listops trainer.seq_len=256 data.min_length=64 data.max_length=256 trainer.batch_size=8 trainer.max_steps=250) ;;
    text) extra=(experiment=lra_text trainer.seq_len=512 trainer.batch_size=8 trainer.max_steps=150
                 "data.path=${IMDB:?set IMDB to the aclImdb_v1 tarball}") ;;
    image) extra=(experiment=lra_image trainer.seq_len=1024 trainer.batch_size=4 trainer.max_steps=150
                  "data.path=${CIFAR_DIR:?set CIFAR_DIR (real or synthetic cifar-10-batches-py)}") ;;
    *) echo "unknown task $task" >&2; exit 2 ;;
  esac
  PYTHONPATH=$ROOT $PY "$ROOT/experiments/train.py" -m "${extra[@]}" "${COMMON[@]}" "hydra.sweep.dir=$OUT/$task${SUFFIX:-}"
done
