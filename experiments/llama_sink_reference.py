"""The same sink measurement on a model we did not write: Hugging Face's Llama, same data, size and budget.

Why: the study ``streaming`` finds that our small rotary model trained on Tiny Shakespeare gives its
first keys less than a uniform share of attention, so StreamingLLM's window attention does not fail for it
(results/streaming/rope). Before calling that a matter of scale, the same question is put to an
implementation we did not write: ``transformers.LlamaForCausalLM`` (rotary, pre-norm RMSNorm, SwiGLU),
d 128, 4 layers, 4 heads, d_ff 512, attention dropout 0.1, trained here for the same 2,000 steps of 16 x 256
characters of the same split (read in place through our task), Adam at 1e-3 with 100 warm-up steps and a
cosine decay, as ``experiment=shakespeare`` trains ours; then the mean attention weight its queries at
positions 128-255 give to the first 4 keys, per layer and head, from its own ``output_attentions``.

Deviations: Llama's block (RMSNorm, SwiGLU, untied output layer: 1.07M parameters against our 0.80M) is
not ours; batches are drawn at random positions of the training split with a seeded generator, not by our
trainer's sampler. Needs ``transformers`` (``make peers``).

    python experiments/llama_sink_reference.py runs/streaming_rope/train/checkpoints/best.pt \\
        --steps 2000 --out results/streaming/rope

(the checkpoint only names the task and its data: the Llama model is trained from scratch). Writes
``llama_sink_mass.csv`` and ``llama_result.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

import zoo
from zoo.app.run import load_run
from zoo.bench.report import write_csv
from zoo.train.eval_protocols import split_stream


def build_llama(vocab: int, length: int, intermediate: int = 512, tie: bool = False):
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as error:  # an optional reference: say how to get it
        raise SystemExit(f"this check needs Hugging Face transformers (make peers): {error}") from error
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=intermediate,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=length,
        attention_dropout=0.1,
        attn_implementation="eager",  # the attention weights themselves, for output_attentions
        tie_word_embeddings=tie,
    )
    return LlamaForCausalLM(config)


def build_xtransformers(vocab: int, length: int):
    """x-transformers' decoder in our ``vanilla_lm`` pre-norm shape: LayerNorm before each sub-layer, GELU
    feed-forward of 512 with biases, 4 heads of 32, rotary over the whole head, tied embeddings, attention
    dropout 0.1 (798,464 parameters against our 801,664)."""
    try:
        from x_transformers import Decoder, TransformerWrapper
    except ImportError as error:
        raise SystemExit(f"--model x-transformers needs x-transformers (make peers): {error}") from error
    layers = Decoder(dim=128, depth=4, heads=4, attn_dim_head=32, rotary_pos_emb=True, ff_mult=4, attn_dropout=0.1)
    return TransformerWrapper(
        num_tokens=vocab, max_seq_len=length, use_abs_pos_emb=False, tie_embedding=True, attn_layers=layers
    )


def next_token_loss(model, batch: torch.Tensor, kind: str) -> torch.Tensor:
    """Mean cross-entropy of each next token inside batch [b, t] (t - 1 predictions; ours takes tokens and
    targets, HF's labels = the inputs, shifted inside, x-transformers returns logits)."""
    if kind == "ours":
        return model(batch[:, :-1], batch[:, 1:]).loss
    if kind == "x-transformers":
        logits = model(batch[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    return model(batch, labels=batch).loss


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


@torch.no_grad()
def sink_rows(model, segments: torch.Tensor, first: int, sinks: int) -> list[dict]:
    attentions = model(segments, output_attentions=True).attentions  # per layer [n, h, t, t]
    t = segments.shape[1]
    uniform = float((sinks / torch.arange(first + 1, t + 1, dtype=torch.float64)).mean())
    rows = []
    for layer, weights in enumerate(attentions):
        for head, mass in enumerate(weights[:, :, first:, :sinks].sum(-1).mean((0, 2)).tolist()):
            rows.append(dict(layer=layer, head=head, mass=mass, uniform=uniform, ratio=mass / uniform))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a run of ours whose task (and data path) the reference trains on")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--intermediate", type=int, default=512, help="SwiGLU width (341 with --tie: our model's parameter count)"
    )
    parser.add_argument("--tie", action="store_true", help="tie the output layer to the embedding, as ours")
    parser.add_argument("--prefix", default="llama", help="file name prefix of the outputs")
    parser.add_argument(
        "--model",
        choices=["llama", "ours", "x-transformers"],
        default="llama",
        help="ours: our model of the checkpoint's config (fresh weights) in this same loop, which separates the "
        "model from our trainer's data order and settings; x-transformers: its decoder in our pre-norm shape",
    )
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--from", dest="first", type=int, default=128)
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--segments", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    _, task, ours, _ = load_run(args.checkpoint)
    train = torch.from_numpy(split_stream(task, "train"))
    test = torch.from_numpy(split_stream(task, "test"))
    if args.model == "ours":
        model = zoo.create_model(**ours.config.to_dict())  # the same architecture, initialised afresh
    elif args.model == "x-transformers":
        model = build_xtransformers(task.vocab_size, args.length)
    else:
        model = build_llama(task.vocab_size, args.length, args.intermediate, args.tie)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    begin = time.perf_counter()
    model.train()
    for step in tqdm(range(args.steps), desc="llama", unit="step", disable=None):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr, args.warmup)
        starts = torch.randint(0, len(train) - args.length - 1, (args.batch_size,), generator=generator)
        batch = torch.stack([train[s : s + args.length + 1] for s in starts.tolist()])
        loss = next_token_loss(model, batch[:, :-1], args.model)  # 256 tokens, 255 predictions, both models
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()
    n = min(args.segments, len(test) // args.length)
    segments = test[: n * args.length].view(n, args.length)
    with torch.no_grad():
        test_bpc = float(next_token_loss(model, segments, args.model)) / math.log(2)
    if args.model != "llama":  # attention weights: Llama's own output; ours through zoo/studies/streaming_modes.py
        print(f"{args.model} in this loop: {args.steps} steps, test bpc {test_bpc:.3f} on {n} segments")
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            summary = dict(vars(args), test_bpc=test_bpc, parameters=sum(p.numel() for p in model.parameters()))
            (Path(args.out) / f"{args.prefix}_result.json").write_text(json.dumps(summary, indent=2))
        return
    rows = sink_rows(model, segments, args.first, args.sinks)
    print(f"llama: {args.steps} steps in {time.perf_counter() - begin:.0f} s, test bpc {test_bpc:.3f} on {n} segments")
    for layer in sorted({r["layer"] for r in rows}):
        heads = [r for r in rows if r["layer"] == layer]
        print(f"  layer {layer}: " + "  ".join(f"{r['mass']:.4f} ({r['ratio']:.1f}x)" for r in heads))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_csv(out / f"{args.prefix}_sink_mass.csv", rows)
        summary = dict(vars(args), test_bpc=test_bpc, parameters=sum(p.numel() for p in model.parameters()))
        (out / f"{args.prefix}_result.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
