"""Generate from a language-model checkpoint (text tasks decode to text).

    python experiments/sample.py outputs/.../checkpoints/best.pt --prompt "ROMEO:" --tokens 300
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from zoo.app.run import load_run  # noqa: E402
from zoo.trainer import pick_device  # noqa: E402


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--prompt", default="", help="text to continue (text tasks); empty = the start of a validation batch")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--greedy", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-path", default="")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    _, task, model, _ = load_run(args.checkpoint, data={"path": args.data_path} if args.data_path else None, batch_size=1)
    if model.config.kind != "lm":
        raise SystemExit(f"error: sampling needs a language model; this checkpoint is a {model.config.kind} model")
    device = pick_device(args.device)
    model.to(device)
    ids = task.encode(args.prompt) if args.prompt else task.batch("val", 0)["tokens"][0, :16].tolist()
    prompt = torch.tensor([ids], dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    out = model.generate(prompt, args.tokens, temperature=args.temperature, top_k=args.top_k, greedy=args.greedy, generator=generator)
    text = task.decode(out[0].tolist())
    print(text)
    return text


if __name__ == "__main__":
    main()
