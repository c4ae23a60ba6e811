"""Universal Transformer algorithmic tasks (Dehghani et al. 2019, arXiv:1807.03819, Table 4),
scaled down for a CPU: copy, reverse and integer addition, trained on short strings and tested on
longer ones, for the Universal Transformer with ACT, the fixed-depth Universal Transformer and the
vanilla encoder-decoder at (nearly) equal parameter count.

    python experiments/universal_algorithmic.py --out results/universal_algorithmic

or one process per task (out/<task>/), then ``--merge`` joins them into out/results.{csv,md}.

Writes results.csv, results.md (with the paper's numbers beside ours) and ponder_steps.png (the
ACT encoder's steps per source position for a few test examples). Greedy decoding; scores over the
answer symbols plus eos (see zoo.data.algorithmic.score).
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch

import zoo
from zoo.data.algorithmic import PAPER_TABLE4, TASKS, algorithmic_batch, score, vocab_size
from zoo.train.steps import adam, schedule, train_step

PAPER = PAPER_TABLE4  # (task, row) -> (char-acc, seq-acc), train length 40, test length 400

# name -> (preset, overrides, paper row). Equal parameter budget: 4 vanilla layers at d 64
# hold as many weights as one shared block at d 128 (params ~ layers * d^2).
MODELS = {
    "universal_transformer_act": (
        "universal_seq2seq_act",
        dict(d_model=128, n_heads=4, d_ff=512, n_layers=4, stack={"max_steps": 8}),
        "ut",
    ),
    "universal_transformer": (
        "universal_seq2seq_act",
        dict(d_model=128, n_heads=4, d_ff=512, n_layers=4, stack={"act": False}),
        "ut",
    ),
    "vanilla_seq2seq": ("vanilla_seq2seq", dict(d_model=64, n_heads=4, d_ff=256, n_layers=4), "transformer"),
}


def build(name: str, task: str) -> zoo.ZooModel:
    preset, overrides, _ = MODELS[name]
    return zoo.create_model(preset, vocab_size=vocab_size(task), dropout=0.0, label_smoothing=0.0, **overrides)


@torch.no_grad()
def evaluate(model, task: str, length: int, n: int, seed: int) -> tuple[float, float]:
    g = torch.Generator().manual_seed(seed)
    batch = algorithmic_batch(task, n, length, length, generator=g)
    predicted = model.generate(batch["src"], max_len=batch["targets"].shape[1], src_pad_mask=batch["src_pad_mask"])
    return score(predicted, batch["targets"])


def run(task: str, name: str, args) -> dict:
    torch.manual_seed(args.seed)
    model = build(name, task)
    optimizer = adam(model, lr=args.lr)
    scheduler = schedule(optimizer, "cosine", warmup=args.steps // 10, total=args.steps)
    g = torch.Generator().manual_seed(args.seed + 1)
    start = time.process_time()
    steps_seen = []
    for step in range(args.steps):
        batch = algorithmic_batch(task, args.batch, args.train_min, args.train_max, generator=g)
        out, loss = train_step(model, batch, optimizer, scheduler=scheduler)
        if "encoder/act/steps_mean" in out.stats:
            steps_seen.append(float(out.stats["encoder/act/steps_mean"]))
        if step % max(1, args.steps // 5) == 0:
            print(f"  {task} {name} step {step} loss {loss.item():.3f}", flush=True)
    train_cpu = time.process_time() - start
    model.eval()
    row = {
        "task": task,
        "model": name,
        "params": model.num_parameters,
        "train_steps": args.steps,
        "train_cpu_s": round(train_cpu, 1),
        "final_loss": round(loss.item(), 4),
    }
    row["iid_char_acc"], row["iid_seq_acc"] = evaluate(model, task, args.train_max, args.n_test, args.seed + 2)
    row["test_char_acc"], row["test_seq_acc"] = evaluate(model, task, args.test_len, args.n_test, args.seed + 3)
    paper = PAPER[(task, MODELS[name][2])]
    row["paper_char_acc"], row["paper_seq_acc"] = paper
    if steps_seen:
        row["train_encoder_steps_mean_last"] = round(sum(steps_seen[-50:]) / len(steps_seen[-50:]), 2)
    return row, model


def ponder_plot(model, task: str, args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = torch.Generator().manual_seed(args.seed + 4)
    batch = algorithmic_batch(task, 3, args.test_len // 2, args.test_len, generator=g)
    with torch.no_grad():
        out = model(batch["src"], batch["tgt"], src_pad_mask=batch["src_pad_mask"], tgt_pad_mask=batch["tgt_pad_mask"])
    enc, dec = out.stats["encoder/act/steps"], out.stats["act/steps"]
    fig, axes = plt.subplots(3, 2, figsize=(10, 5), sharey=True)
    for i in range(3):
        for j, (steps, mask, label) in enumerate(
            (
                (enc, batch["src_pad_mask"], "encoder (source position)"),
                (dec, batch["tgt_pad_mask"], "decoder (target position)"),
            )
        ):
            n = int(mask[i].sum())
            axes[i, j].bar(range(n), steps[i, :n].numpy(), color="tab:blue" if j == 0 else "tab:orange")
            axes[i, j].set_ylabel("steps")
            if i == 2:
                axes[i, j].set_xlabel(label)
    fig.suptitle(f"ACT ponder steps per position, {task}, 3 test examples (max {model.encoder.steps})")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--train-min", type=int, default=10)
    parser.add_argument("--train-max", type=int, default=20)
    parser.add_argument("--test-len", type=int, default=40)
    parser.add_argument("--n-test", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/universal_algorithmic")
    parser.add_argument("--merge", action="store_true", help="only join out/<task>/results.csv of per-task runs")
    args = parser.parse_args()
    if args.merge:
        merge(Path(args.out), args)
        return
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for task in args.tasks.split(","):
        for name in args.models.split(","):
            row, model = run(task, name, args)
            print(row, flush=True)
            rows.append(row)
            if name == "universal_transformer_act":
                ponder_plot(model, task, args, out / f"ponder_steps_{task}.png")
            with open(out / "results.csv", "w", newline="") as f:  # rewritten after each run
                keys = list(dict.fromkeys(k for r in rows for k in r))
                writer = csv.DictWriter(f, fieldnames=keys, restval="")
                writer.writeheader()
                writer.writerows(rows)
    write_table(rows, out, args)


def write_table(rows: list[dict], out: Path, args) -> None:
    lines = [
        f"Train lengths {args.train_min}-{args.train_max}, test length {args.test_len}; {args.steps} steps x "
        f"batch {args.batch}, Adam lr {args.lr} cosine, {args.threads} thread(s), seed {args.seed}; greedy "
        f"decoding, {args.n_test} test strings per length.",
        "",
        f"| task | model | params | train CPU s | char-acc len {args.train_max} | seq-acc len {args.train_max} | "
        f"char-acc len {args.test_len} | seq-acc len {args.test_len} | paper char / seq (train 40, test 400) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['model']} | {int(r['params']):,} | {r['train_cpu_s']} | "
            f"{float(r['iid_char_acc']):.2f} | {float(r['iid_seq_acc']):.2f} | {float(r['test_char_acc']):.2f} | "
            f"{float(r['test_seq_acc']):.2f} | {float(r['paper_char_acc']):.2f} / {float(r['paper_seq_acc']):.2f} "
            "|"
        )
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def merge(out: Path, args) -> None:
    """Join the results.csv of per-task runs (out/<task>/) into out/results.csv and .md."""
    rows = []
    for task in args.tasks.split(","):
        with open(out / task / "results.csv") as f:
            rows.extend(csv.DictReader(f))
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: r.get(k, "") for k in rows[0]} for r in rows)
    write_table(rows, out, args)


if __name__ == "__main__":
    main()
