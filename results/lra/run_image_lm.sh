#!/usr/bin/env bash
# A brief image language model on a CIFAR-10-shaped synthetic set (zoo.data.images.synthetic_cifar10)
# for the sample grid in results/lra/: the Image Transformer configuration at a CPU size (2 layers,
# d = 64) with vanilla attention, whose KV cache makes sampling 3,072 intensities per image
# feasible on a CPU (local_1d keeps no cache, so each sampled intensity would recompute the
# prefix); one thread. Usage: run_image_lm.sh <cifar dir> <run dir>
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python}
PYTHONPATH=$ROOT $PY "$ROOT/experiments/train.py" experiment=paper/image_transformer_cifar10 "data.path=$1" data.val_size=500 attention=vanilla \
  model.d_model=64 model.n_layers=2 model.n_heads=4 model.d_ff=128 model.dropout=0.0 \
  optim=adam optim.lr=2e-3 optim.schedule=cosine optim.warmup=20 trainer.batch_size=4 trainer.max_steps=100 \
  trainer.eval_every=0 trainer.eval_split=test trainer.eval_batches=25 trainer.threads=1 trainer.progress=false \
  trainer.device=cpu logger=csv "hydra.run.dir=$2"
