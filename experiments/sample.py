"""Generate from a language-model checkpoint: text tasks decode to text; image tasks (data=cifar10,
imagenet64) write a PNG grid of samples and of completions of the top half of test images.

    python experiments/sample.py outputs/.../checkpoints/best.pt --prompt "ROMEO:" --tokens 300
    python experiments/sample.py outputs/.../checkpoints/last.pt --images 6 --png samples.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from zoo.app.run import load_run
from zoo.train.options import pick_device


def sample_images(args: argparse.Namespace, task, model, device: torch.device) -> Path:
    """Rows: unconditional samples; test images; their completions from the top half down."""
    from zoo.data.images import START, image_grid, tokens_to_image, write_png

    size, n = task.image_size, args.images
    dims = 3 * size * size
    generator = torch.Generator(device=device).manual_seed(args.seed)
    options = dict(temperature=args.temperature, top_k=args.top_k, greedy=args.greedy, generator=generator)
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


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument(
        "--prompt", default="", help="text to continue (text tasks); empty = the start of a validation batch"
    )
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=0)
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
    generator = torch.Generator(device=device).manual_seed(args.seed)
    out = model.generate(
        prompt, args.tokens, temperature=args.temperature, top_k=args.top_k, greedy=args.greedy, generator=generator
    )
    text = task.decode(out[0].tolist())
    print(text)
    return text


if __name__ == "__main__":
    try:
        main()
    except ImportError as exc:  # the run's imports= module is gone: the message says what to do
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
