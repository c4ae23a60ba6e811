"""ListOps in our app beside mlpen/Nystromformer's LRA code, step for step (results/lra_parity/README.md).

Our side is the app's own path: the config ``experiment=lra_listops lra_setting=nystromformer`` composes
(plus the overrides given), ``zoo.app.run.build`` makes the task and model, ``make_optimizer`` /
``make_schedule`` the AdamW and one-cycle schedule, ``train_step`` each step. Their side is their
``ModelForSC`` (``model_wrapper.py``) with their ListOps config (``lra_config.py``) and the optimiser,
``OneCycleLR`` and step of their ``run_tasks.py``, fp32 (their ``mixed_precision`` off: no GPU here).
Their model starts from our initial weights, copied (``copy_into_theirs``), and both see the same
batches from our ListOps task; dropout is 0 on both sides so the two losses can be compared per step:

    python experiments/lra_parity.py --reference ../ref/Nystromformer/LRA/code --steps 200 \\
        --out results/lra_parity/steps_setting.csv -- data.max_length=512 data.min_length=256 trainer.seq_len=512
    python experiments/lra_parity.py --plot results/lra_parity/relative_difference.png results/lra_parity/steps_*.csv

The overrides after ``--`` go to our config (length, init, pooling); the reference reads the same length
and batch from them. Only softmax attention (``attention=vanilla`` / their ``softmax``) is mapped.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import torch

from zoo.app.compose import compose
from zoo.app.run import build, optim_options
from zoo.bench.peers import import_checkout
from zoo.bench.report import write_csv
from zoo.train.options import make_optimizer, make_schedule
from zoo.train.steps import train_step

SETTING = ["experiment=lra_listops", "lra_setting=nystromformer", "attention=vanilla", "trainer.device=cpu"]
NO_DROPOUT = ["model.dropout=0", "model.attention_dropout=0"]


def their_model(reference: Path, max_len: int, attention: str = "softmax", *, dropout: bool = False, seq_len: int = 0):
    """Their ModelForSC for ListOps with ``attention`` (a key of their extra_attn_config), fp32, position
    table of ``max_len``; dropout 0 unless ``dropout``. Returns (model, their training config)."""
    lra_config, wrapper = import_checkout(reference, "lra_config", "model_wrapper")
    config = {**lra_config.config["listops"]["model"], "mixed_precision": False, "attn_type": attention}
    config.update(lra_config.config["listops"]["extra_attn_config"][attention])
    config.update(max_seq_len=max_len)
    if seq_len:  # attention_nystrom.py reads config["seq_len"], which their run_tasks.py never sets
        config.update(seq_len=seq_len)
    if not dropout:
        config.update(dropout_prob=0.0, attention_dropout=0.0)
    return wrapper.ModelForSC(config), lra_config.config["listops"]["training"]


def their_optimiser(model: torch.nn.Module, training: dict):
    """run_tasks.py: AdamW(betas (0.9, 0.999), eps 1e-6) and OneCycleLR(pct_start = warmup / steps, linear)."""
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=training["learning_rate"],
        betas=(0.9, 0.999),
        eps=1e-6,
        weight_decay=training["weight_decay"],
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer,
        max_lr=training["learning_rate"],
        pct_start=training["warmup"] / training["num_train_steps"],
        anneal_strategy=training["lr_decay"],
        total_steps=training["num_train_steps"],
    )
    return optimizer, scheduler


def their_names(n_layers: int) -> dict[str, str]:
    """Our parameter name -> theirs (the token table is handled apart: theirs has padded rows)."""
    names = {
        "position.table.weight": "model.embeddings.position_embeddings.weight",
        "norm.weight": "model.norm.weight",
        "norm.bias": "model.norm.bias",
    }
    for ours, theirs in (("head.0", "seq_classifer.mlpblock.0"), ("head.2", "seq_classifer.mlpblock.2")):
        for kind in ("weight", "bias"):
            names[f"{ours}.{kind}"] = f"{theirs}.{kind}"
    per_layer = {
        "attention.to_q": "mha.W_q",
        "attention.to_k": "mha.W_k",
        "attention.to_v": "mha.W_v",
        "attention.to_out": "mha.ff",
        "feed_forward.w1": "mlpblock.0",
        "feed_forward.w2": "mlpblock.3",
        "attention_residual.norm": "norm1",
        "feed_forward_residual.norm": "norm2",
    }
    for layer in range(n_layers):
        for ours, theirs in per_layer.items():
            for kind in ("weight", "bias"):
                names[f"stack.blocks.{layer}.{ours}.{kind}"] = f"model.transformer_{layer}.{theirs}.{kind}"
    return names


@torch.no_grad()
def copy_into_theirs(ours: torch.nn.Module, theirs: torch.nn.Module, n_layers: int) -> None:
    """Our weights into their model; every one of their parameters but the unused token rows is written."""
    mine, target = ours.state_dict(), theirs.state_dict()
    names = their_names(n_layers)
    unmapped = set(mine) - set(names) - {"embed.weight"}
    if unmapped:
        raise ValueError(f"no counterpart in their model for {sorted(unmapped)}: only softmax attention is mapped")
    for name, their_name in names.items():
        target[their_name].copy_(mine[name])
    rows = mine["embed.weight"].shape[0]
    target["model.embeddings.word_embeddings.weight"][:rows].copy_(mine["embed.weight"] * ours.embed.scale)
    theirs.load_state_dict(target)


def their_step(model, optimizer, scheduler, batch: dict[str, torch.Tensor]) -> float:
    """run_tasks.py's training step, one accumulation chunk, no GradScaler (fp32)."""
    optimizer.zero_grad()
    outputs = model(input_ids_0=batch["tokens"], mask_0=batch["pad_mask"].float(), label=batch["targets"])
    loss = outputs["loss"].mean()
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss.item()


@torch.no_grad()
def their_accuracy(model: torch.nn.Module, task, split: str) -> float:
    """Accuracy of their model over every batch of ``split`` (ListOps dev: 62 batches of 32 = 1,984)."""
    model.eval()
    correct = count = 0.0
    for batch in task.eval_batches(split, None):
        outputs = model(input_ids_0=batch["tokens"], mask_0=batch["pad_mask"].float(), label=batch["targets"])
        correct += float(outputs["accu"].sum())
        count += outputs["accu"].numel()
    model.train()
    return correct / count


def train_theirs(args, resolved: dict, task) -> float:
    """Their model and loop alone at the setting's budget on our batches, dropout on, logged like our runs
    (metrics.jsonl with train/loss and val/accuracy, for results/lra_nystromformer/curve.py), resumable from
    last.pt (every 100 steps); the best dev state is scored on the test split into result.json."""
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = resolved["trainer"]
    torch.manual_seed(resolved["seed"])
    model, training = their_model(
        Path(args.reference), resolved["model"]["max_len"], args.theirs, dropout=True, seq_len=trainer["seq_len"]
    )
    optimizer, scheduler = their_optimiser(model, training)
    start, best, last = 0, -1.0, run_dir / "last.pt"
    if last.is_file():
        saved = torch.load(last, weights_only=True)  # data only: tensors, numbers, strings
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["rng"])
        start, best = saved["step"], saved["best"]
        print(f"resumed at step {start} (best dev accuracy so far {best:.4f})")
        log_path = run_dir / "metrics.jsonl"  # rows logged after last.pt was written are run again: drop them
        if log_path.is_file():
            kept = [line for line in log_path.read_text().splitlines() if json.loads(line)["step"] <= start]
            log_path.write_text("".join(line + "\n" for line in kept))
    total, every = training["num_train_steps"], trainer["eval_every"]
    stop = min(total, args.stop_after or total)  # a shorter look at the same schedule
    model.train()
    with open(run_dir / "metrics.jsonl", "a") as log:
        losses = []
        for step in range(start, stop):
            losses.append(their_step(model, optimizer, scheduler, task.batch("train", step)))
            done = step + 1
            row = {}
            if done % trainer["log_every"] == 0:
                row = {"step": done, "train/loss": sum(losses) / len(losses), "train/lr": scheduler.get_last_lr()[0]}
                losses = []
            if done % every == 0 or done == stop:
                accuracy = their_accuracy(model, task, "val")
                row = {**row, "step": done, "val/accuracy": accuracy}
                if accuracy > best:
                    best = accuracy
                    torch.save({"model": model.state_dict(), "step": done}, run_dir / "best.pt")
                print(f"step {done}: dev accuracy {accuracy:.4f} (best {best:.4f})", flush=True)
            if row:
                log.write(json.dumps(row) + "\n")
                log.flush()
            if done % 100 == 0 or done == stop:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": done, "best": best}
                torch.save({**state, "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state()}, last)
    best_state = torch.load(run_dir / "best.pt", weights_only=True)
    model.load_state_dict(best_state["model"])
    test = their_accuracy(model, task, "test")
    result = {"attention": args.theirs, "best_step": best_state["step"], "dev_accuracy": best, "test_accuracy": test}
    (run_dir / "result.json").write_text(json.dumps(result, indent=1))
    print(f"test accuracy {test:.4f} (best dev checkpoint, step {best_state['step']})")
    return test


def plot(paths: list[str], out: str) -> None:
    """The relative loss difference per step of each CSV this script wrote, on a log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 3.4))
    for path in paths:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
        # an exact match (0) is drawn at 1e-9, below float32's rounding of a loss near 2 (about 1e-7)
        values = [max(float(row["relative_difference"]), 1e-9) for row in rows]
        axes.semilogy([int(row["step"]) for row in rows], values, label=Path(path).stem, linewidth=1)
    axes.set_xlabel("training step")
    axes.set_ylabel("|ours - theirs| / theirs")
    axes.set_title("ListOps loss, ours beside mlpen/Nystromformer's run_tasks.py")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> float:
    """Runs the comparison; returns the largest relative loss difference."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", help="mlpen/Nystromformer's LRA/code directory")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dropout", action="store_true", help="keep the setting's dropout (no step parity then)")
    parser.add_argument("--out", help="CSV: step, our loss, their loss, relative difference, rates")
    parser.add_argument("overrides", nargs="*", help="our config overrides (after --)")
    parser.add_argument("--plot", nargs="+", default=None, help="OUT.png CSV...: plot earlier runs, train nothing")
    parser.add_argument("--theirs", default="", help="train their model alone with this attention (nystrom-64, ...)")
    parser.add_argument("--run-dir", default="", help="with --theirs: where its metrics and checkpoints go")
    parser.add_argument("--stop-after", type=int, default=0, help="with --theirs: stop after N steps (0 = all)")
    args = parser.parse_args(argv)
    if args.plot:
        plot(args.plot[1:], args.plot[0])
        return 0.0
    if not (args.reference and (args.out or (args.theirs and args.run_dir))):
        parser.error("give --reference and --out (step parity) or --theirs and --run-dir (their run alone)")
    torch.set_num_threads(1)

    if args.theirs:  # their loop at the setting's budget: our task's batches, their everything else
        resolved, task, _ = build(compose(SETTING + args.overrides))
        return train_theirs(args, resolved, task)
    cfg = compose(SETTING + ([] if args.dropout else NO_DROPOUT) + args.overrides)
    resolved, task, ours = build(cfg)
    model_cfg = ours.config
    if model_cfg.head != "mlp" or model_cfg.attention["name"] != "vanilla":
        raise ValueError("their ModelForSC has the mlp head and (mapped here) softmax attention only")
    theirs, training = their_model(Path(args.reference), model_cfg.max_len)
    copy_into_theirs(ours, theirs, model_cfg.n_layers)

    options = optim_options(resolved)
    total = resolved["trainer"]["max_steps"]
    optimizer = make_optimizer(ours, options)
    scheduler = make_schedule(optimizer, options, d_model=model_cfg.d_model, total=total)
    their_optimizer, their_scheduler = their_optimiser(theirs, training)
    if total != training["num_train_steps"]:
        raise ValueError(f"our schedule spans {total} steps, theirs {training['num_train_steps']}")

    rows, worst = [], 0.0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for step in range(args.steps):
        batch = task.batch("train", step)
        our_rate, their_rate = optimizer.param_groups[0]["lr"], their_optimizer.param_groups[0]["lr"]
        _, loss = train_step(ours, batch, optimizer, scheduler=scheduler, clip=resolved["trainer"]["clip"])
        theirs.train()
        their_loss = their_step(theirs, their_optimizer, their_scheduler, batch)
        loss = float(loss)
        relative = abs(loss - their_loss) / abs(their_loss)
        worst = max(worst, relative)
        rows.append(
            {
                "step": step,
                "our_loss": f"{loss:.8f}",
                "their_loss": f"{their_loss:.8f}",
                "relative_difference": f"{relative:.3e}",
                "our_lr": our_rate,
                "their_lr": their_rate,
            }
        )
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step}: ours {loss:.6f} theirs {their_loss:.6f} rel {relative:.2e} (worst {worst:.2e})")
    write_csv(args.out, rows)
    print(f"{args.steps} steps, largest relative difference {worst:.3e}; wrote {args.out}")
    if not math.isfinite(worst):
        raise SystemExit(1)
    return worst


if __name__ == "__main__":
    main()
