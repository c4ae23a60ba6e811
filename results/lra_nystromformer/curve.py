"""The ListOps runs' curves so far (finished or not): dev accuracy at each evaluation, the training loss
averaged over the steps before it, the step reached, and the test accuracy of the best checkpoint once a
run has finished. Writes listops_curve.csv and prints a markdown table.

    .venv/bin/python results/lra_nystromformer/curve.py runs/lra_nystromformer
"""

import csv
import json
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/lra_nystromformer")
rows = []
for run in sorted(p for p in root.glob("listops_*_s*") if p.is_dir()):
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    losses, last = [], 0
    for m in metrics:
        if "train/loss" in m:
            losses.append(m["train/loss"])
            last = max(last, m["step"])
        if "val/accuracy" in m:
            mean = sum(losses) / len(losses) if losses else float("nan")
            rows.append([run.name, m["step"], f"{100 * m['val/accuracy']:.2f}", f"{mean:.4f}", ""])
            losses = []
    test = run / "test_best.txt"
    if test.is_file():  # evaluate.py's JSON: the test accuracy of the best dev checkpoint and its step
        scored = json.loads(test.read_text()[test.read_text().index("{") :])
        done = f"{100 * scored['test/accuracy']:.2f}% (best checkpoint: step {scored['step']})"
    else:
        done = "running"
    rows.append([run.name, last, "", "", done])
with open(Path(__file__).with_name("listops_curve.csv"), "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["run", "step", "dev_accuracy", "train_loss_since_last_eval", "test_of_best"])
    writer.writerows(rows)
print("| run | step | dev accuracy (%) | train loss (mean since the last evaluation) | test (best checkpoint) |")
print("|---|---|---|---|---|")
for row in rows:
    print("| " + " | ".join(str(c) for c in row) + " |")
