"""The ListOps runs' curves so far (finished or not): dev accuracy at each evaluation, the training loss
averaged over the steps before it, the step reached, and the test accuracy of the best checkpoint once a
run has finished. Reads our runs (train.py's metrics.jsonl, evaluate.py's test_best.txt) and the reference's
(experiments/lra_parity.py --theirs: the same metrics.jsonl keys, result.json) from every directory given.
Writes listops_curve.csv and listops_curve.png beside this file and prints a markdown table.

    .venv/bin/python results/lra_nystromformer/curve.py runs/lra_nystromformer runs/lra_reference
"""

import csv
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REPORTED = 37.1  # softmax attention in this setting (mlpen/Nystromformer), as issue 24 quotes it
MAJORITY = 17.74  # the most frequent answer's share of the 1,984 dev / test sequences


def test_of_best(run: Path) -> str:
    ours, theirs = run / "test_best.txt", run / "result.json"
    if ours.is_file():  # evaluate.py's JSON: the test accuracy of the best dev checkpoint and its step
        text = ours.read_text()
        scored = json.loads(text[text.index("{") :])
        return f"{100 * scored['test/accuracy']:.2f}% (best checkpoint: step {scored['step']})"
    if theirs.is_file():
        scored = json.loads(theirs.read_text())
        return f"{100 * scored['test_accuracy']:.2f}% (best checkpoint: step {scored['best_step']})"
    return "not finished"


roots = [Path(p) for p in sys.argv[1:]] or [Path("runs/lra_nystromformer")]
rows, curves = [], {}
for run in sorted(p for root in roots for p in root.glob("listops_*_s*") if p.is_dir()):
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    losses, last = [], 0
    for m in metrics:
        if "train/loss" in m:
            losses.append(m["train/loss"])
            last = max(last, m["step"])
        if "val/accuracy" in m:
            mean = sum(losses) / len(losses) if losses else float("nan")
            rows.append([run.name, m["step"], f"{100 * m['val/accuracy']:.2f}", f"{mean:.4f}", ""])
            curves.setdefault(run.name, []).append((m["step"], 100 * m["val/accuracy"]))
            losses = []
    rows.append([run.name, last, "", "", test_of_best(run)])
here = Path(__file__).resolve().parent
with open(here / "listops_curve.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["run", "step", "dev_accuracy", "train_loss_since_last_eval", "test_of_best"])
    writer.writerows(rows)

figure, axes = plt.subplots(figsize=(6.4, 3.6))
for name, points in curves.items():
    steps, accuracy = zip(*points)
    axes.plot(steps, accuracy, marker="o", markersize=3, linewidth=1, label=name.removeprefix("listops_"))
axes.axhline(REPORTED, color="grey", linestyle="--", linewidth=0.8, label=f"reported, softmax ({REPORTED}%)")
axes.axhline(MAJORITY, color="grey", linestyle=":", linewidth=0.8, label=f"most frequent answer ({MAJORITY}%)")
axes.set_xlabel("training step (batches of 32)")
axes.set_ylabel("dev accuracy (%)")
axes.set_title("ListOps, lra_setting=nystromformer")
axes.legend(fontsize=7)
figure.tight_layout()
figure.savefig(here / "listops_curve.png", dpi=100)

print("| run | step | dev accuracy (%) | train loss (mean since the last evaluation) | test (best checkpoint) |")
print("|---|---|---|---|---|")
for row in rows:
    print("| " + " | ".join(str(c) for c in row) + " |")
