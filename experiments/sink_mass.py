"""Does a trained model park attention on its first tokens? The premise of StreamingLLM's sinks, measured.

Paper: Xiao, Tian, Chen, Han, Lewis 2023, "Efficient Streaming Language Models with Attention Sinks",
arXiv:2309.17453, Section 3.1 and Figure 2: in Llama-2 and other LLMs, beyond the first two layers most
heads give the initial token a large share of their attention whatever it says (an "attention sink"), so
evicting it from a window cache breaks the model, and keeping it restores the model.

Here: a checkpoint trained by the app (dense causal ``vanilla`` attention) reads segments of ``--length``
tokens of a split, and for each layer and head we report the mean attention weight the queries at
positions ``--from`` ... length - 1 give to the segment's first ``--sinks`` keys, beside the weight a
uniform distribution over the keys would give them (sinks / (i + 1) for the query at i). A ratio far above
1 is a sink; near or below 1, evicting those keys costs what evicting any key does. The weights are
recomputed from each layer's input as its ``forward`` would (projections, the position part's rotation and
bias, the causal mask): a [t, t] matrix per head, a diagnostic at a few hundred tokens, not a mechanism.

    python experiments/sink_mass.py runs/streaming_rope/train/checkpoints/best.pt --length 256 --from 128 \\
        --segments 32 --out results/streaming/rope

Writes ``sink_mass.csv`` (layer, head, mass, uniform, ratio) and prints a table per layer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from zoo.app.run import load_run
from zoo.attention.vanilla import VanillaAttention
from zoo.bench.report import write_csv
from zoo.train.eval_protocols import split_stream


def attention_weights(attn: VanillaAttention, x: torch.Tensor) -> torch.Tensor:
    """softmax of the layer's causal scores over x [b, t, d] (the attention's input) -> [b, h, t, t]."""
    t = x.shape[1]
    positions = torch.arange(t, device=x.device)
    q, k = attn.split_heads(attn.to_q(x)), attn.split_heads(attn.to_k(x))
    q, k = attn.rotate(q, positions), attn.rotate(k, positions)
    scores = torch.einsum("bhik,bhjk->bhij", q, k) * q.shape[-1] ** -0.5
    bias = attn.pair_bias(positions[:, None] - positions[None, :], scores.dtype)  # [h, t, t] or None
    if bias is not None:
        scores = scores + bias
    future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1)


@torch.no_grad()
def sink_mass(model: torch.nn.Module, segments: torch.Tensor, first: int, sinks: int) -> list[dict]:
    """Per layer and head: the mean weight queries first ... t - 1 give to keys 0 ... sinks - 1, and the
    uniform share. segments: long [n, t]."""
    layers = [m for m in model.modules() if isinstance(m, VanillaAttention)]
    if not layers:
        raise SystemExit("the checkpoint has no vanilla attention: the weights are recomputed as vanilla computes them")
    inputs: dict[int, torch.Tensor] = {}
    hooks = [
        layer.register_forward_pre_hook(lambda module, args, index=index: inputs.__setitem__(index, args[0]))
        for index, layer in enumerate(layers)
    ]
    try:
        model(segments)
    finally:
        for hook in hooks:
            hook.remove()
    t = segments.shape[1]
    rows = []
    uniform = float((sinks / torch.arange(first + 1, t + 1, dtype=torch.float64)).mean())
    for index, layer in enumerate(layers):
        weights = attention_weights(layer, inputs[index])[:, :, first:, :sinks].sum(-1)  # [n, h, t - first]
        for head, mass in enumerate(weights.mean((0, 2)).tolist()):
            rows.append(dict(layer=index, head=head, mass=mass, uniform=uniform, ratio=mass / uniform))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--length", type=int, default=256, help="tokens per segment (the training length)")
    parser.add_argument("--from", dest="first", type=int, default=128, help="first query position counted")
    parser.add_argument("--sinks", type=int, default=4, help="the first keys whose weight is summed")
    parser.add_argument("--segments", type=int, default=32)
    parser.add_argument("--split", default="test", choices=["val", "test"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="folder for sink_mass.csv")
    args = parser.parse_args(argv)
    if not 0 <= args.first < args.length:
        raise SystemExit(f"--from must lie in [0, --length); got {args.first} with --length {args.length}")
    torch.set_num_threads(args.threads)
    _, task, model, _ = load_run(args.checkpoint)
    stream = torch.from_numpy(split_stream(task, args.split))
    n = min(args.segments, len(stream) // args.length)
    if n == 0:
        raise SystemExit(f"the {args.split} split is shorter than one segment of {args.length}")
    segments = stream[: n * args.length].view(n, args.length)
    rows = sink_mass(model.eval(), segments, args.first, args.sinks)
    print(
        f"weight on the first {args.sinks} keys, queries {args.first}-{args.length - 1}, {n} segments "
        f"(uniform share {rows[0]['uniform']:.4f})"
    )
    for layer in sorted({r["layer"] for r in rows}):
        heads = [r for r in rows if r["layer"] == layer]
        print(f"  layer {layer}: " + "  ".join(f"{r['mass']:.4f} ({r['ratio']:.1f}x)" for r in heads))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_csv(out / "sink_mass.csv", rows)


if __name__ == "__main__":
    main()
