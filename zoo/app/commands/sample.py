"""Generate from a language-model checkpoint: text tasks decode to text; image tasks (data=cifar10,
imagenet64) write a PNG grid of samples and of completions of the top half of test images.

    python experiments/sample.py outputs/.../checkpoints/best.pt --prompt "ROMEO:" --tokens 300
    python experiments/sample.py outputs/.../checkpoints/best.pt --top-p 0.9 --eos 0 --stream
    python experiments/sample.py outputs/.../checkpoints/last.pt --images 6 --png samples.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from zoo.app.run import load_run
from zoo.data.images import START, image_grid, tokens_to_image, write_png
from zoo.train.checkpoints.format import CheckpointError
from zoo.train.options import pick_device


def sample_images(args: argparse.Namespace, task, model, device: torch.device) -> Path:
    """Rows: unconditional samples; test images; their completions from the top half down."""

    size, n = task.image_size, args.images
    dims = 3 * size * size
    options = generation_options(args, device)
    start = torch.full((n, 1), START, dtype=torch.long, device=device)
    samples = model.generate(start, dims, **options)[:, 1:]
    originals = torch.cat([task.batch("test", i)["targets"][:1] for i in range(n)]).to(device)
    half = dims // 2  # the top half of the rows, all channels
    completions = model.generate(torch.cat([start, originals[:, :half]], dim=1), dims - half, **options)[:, 1:]
    rows = [[tokens_to_image(x.cpu(), size) for x in batch] for batch in (samples, originals, completions)]
    path = Path(args.png) if args.png else Path(args.checkpoint).resolve().parent / "samples.png"
    write_png(path, image_grid(rows))
    print(f"wrote {path}: row 1 samples, row 2 test images, row 3 completions of their top half")
    return path


def generation_options(args: argparse.Namespace, device: torch.device) -> dict:
    """generate()'s keyword arguments from the command line: only what was asked for, so a greedy run
    passes no sampling option (generate refuses one that would not run)."""
    options: dict = {"generator": torch.Generator(device=device).manual_seed(args.seed)}
    if args.greedy:
        options["do_sample"] = False
    else:
        options.update(
            do_sample=True, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p
        )
    if args.repetition_penalty != 1.0:
        options["repetition_penalty"] = args.repetition_penalty
    if args.eos:
        options["eos_token_id"] = args.eos
    return options


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument(
        "--prompt", default="", help="text to continue (text tasks); empty = the start of a validation batch"
    )
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep tokens up to this mass")
    parser.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p x the top one's chance")
    parser.add_argument("--repetition-penalty", type=float, default=1.0, help="CTRL's seen-token penalty")
    parser.add_argument("--eos", type=int, nargs="*", default=[], help="end token ids: a row stops at the first")
    parser.add_argument("--stream", action="store_true", help="print the text as it is generated")
    parser.add_argument("--greedy", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-path", default="")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--images", type=int, default=8, help="image tasks: samples and completions per row")
    parser.add_argument("--png", default="", help="image tasks: the grid's path (default: beside the checkpoint)")
    args = parser.parse_args(argv)
    _, task, model, _ = load_run(
        args.checkpoint, data={"path": args.data_path} if args.data_path else None, batch_size=1
    )
    if model.config.kind != "lm":
        raise SystemExit(f"error: sampling needs a language model; this checkpoint is a {model.config.kind} model")
    device = pick_device(args.device)
    model.to(device)
    if getattr(task, "metric", "") == "bpd":  # an image language model
        return str(sample_images(args, task, model, device))
    ids = task.encode(args.prompt) if args.prompt else task.batch("val", 0)["tokens"][0, :16].tolist()
    prompt = torch.tensor([ids], dtype=torch.long, device=device)
    options = generation_options(args, device)
    if args.stream:  # each token as it comes (a token's text may depend on the next for word tasks)
        print(task.decode(ids), end="", flush=True)
        options["streamer"] = lambda tokens: print(task.decode(tokens.tolist()), end="", flush=True)
    out = model.generate(prompt, args.tokens, **options)
    text = task.decode(out[0].tolist())
    print() if args.stream else print(text)
    return text


def command() -> None:
    """``python experiments/sample.py ARGS``: run with this process's arguments; exit 2 with the message on a
    refused input."""
    try:
        main()
    except (CheckpointError, ImportError) as exc:  # an unusable checkpoint, or its imports= module is gone: the
        # message names the file and what to do
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
