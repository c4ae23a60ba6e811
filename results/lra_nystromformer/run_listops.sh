#!/usr/bin/env bash
# ListOps at the PyTorch LRA re-implementations' setting (lra_setting=nystromformer: 2 layers, d 64,
# 5,000 steps of 32 expressions of up to 2,000 tokens padded to 2,048), one mechanism after another, one
# thread each; every run resumes from its own last.pt (trainer.resume=auto), so re-running this script
# continues where it stopped.
# Their own model and loop on the same batches: experiments/lra_parity.py --theirs (results/lra_parity).
#   PYTHON=.venv/bin/python results/lra_nystromformer/run_listops.sh runs/lra_nystromformer [mechanisms...]
# Deviation from their loop, for CPU time only: the dev split (1,984 examples) is scored every 500 steps,
# not every 50, so the best checkpoint is chosen among 10 evaluations instead of 100 (last.pt every 100 steps).
set -u
mkdir -p "${1:-runs/lra_nystromformer}"
OUT=${1:-runs/lra_nystromformer}
shift || true
MECHANISMS=${*:-sparse_fixed local_1d lsh vanilla}
SEED=${SEED:-0}
PYTHON=${PYTHON:-python}
for mech in $MECHANISMS; do
  dir="$OUT/listops_${mech}_s${SEED}"
  if [ -f "$dir/result.json" ]; then echo "done: $dir"; continue; fi
  OMP_NUM_THREADS=1 "$PYTHON" experiments/train.py experiment=lra_listops lra_setting=nystromformer \
    attention="$mech" seed="$SEED" trainer.eval_every=500 trainer.checkpoint_every=100 trainer.threads=1 \
    trainer.progress=false \
    trainer.device=cpu logger=csv trainer.resume=auto hydra.run.dir="$dir" >> "$OUT/listops_${mech}_s${SEED}.log" 2>&1
  status=$?
  if [ $status -ne 0 ]; then echo "stopped: $dir (exit $status)"; exit $status; fi
  OMP_NUM_THREADS=1 "$PYTHON" experiments/evaluate.py "$dir/checkpoints/best.pt" --split test > "$dir/test_best.txt" 2>&1
done
