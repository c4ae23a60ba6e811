"""What the benchmark measures: variants (a zoo preset with overrides, or a peer library's model),
built into a module and a ``loss(tokens)`` closure for one training step, and the tokens they step on.

Variants come from the command line: ``--attention a,b`` (mechanisms in a skeleton preset),
``--model p,q`` (presets), ``--variant key=value ...`` (one variant per flag, as dotted config
overrides, the app's syntax, merged by :func:`zoo.config.merge_config`), ``--peers`` (other
libraries, :data:`zoo.bench.peers.PEER`); ``--compile`` adds each one under ``torch.compile``;
``--precision bf16`` steps every variant under bf16 autocast (:mod:`zoo.precision`), and
``--precision fp32,bf16`` measures each one beside its bf16 twin (``<label>+bf16``);
``--activation-checkpointing none,full,selective:attention`` measures each zoo variant beside its twins under
activation checkpointing (:mod:`zoo.stacks.checkpointing`), labelled ``<label>+ac=<mode>``.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from zoo.bench.peers import PEER
from zoo.precision import PRECISIONS, autocast
from zoo.presets.factory import build_model, resolve_preset
from zoo.stacks.checkpointing import CheckpointPlan
from zoo.train.steps import total_loss


@dataclass
class Variant:
    """One thing to measure: ``kind`` ``zoo`` (preset ``name`` with ``overrides`` merged over it by
    :func:`zoo.config.merge_config`, e.g. ``{"attention": {"name": "lsh", "n_hashes": 8}}``) or
    ``peer`` (another library's model, ``name`` registered in :data:`PEER`)."""

    label: str
    kind: str
    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    compile: bool = False  # the step runs the module under torch.compile (label "<label>+compile")
    precision: str = "fp32"  # the forward runs under autocast at this precision (zoo/precision.py)
    checkpointing: str = "none"  # activation checkpointing (CheckpointPlan.parse: none, full, selective:<k|attention>)


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        # the app's (YAML's) words: null is None, while "none" stays a string (position=none is a part)
        lowered = text.lower()
        return {"true": True, "false": False, "null": None}.get(lowered, text)


def parse_set(items: list[str]) -> dict[str, Any]:
    """Dotted ``key=value`` items (the app's syntax) -> the nested dict :func:`merge_config` takes.

    ``["attention=lsh", "attention.n_hashes=4", "residual=pre_norm"]`` ->
    ``{"attention": {"name": "lsh", "n_hashes": 4}, "residual": "pre_norm"}``: a part named and
    then given options (in either order) becomes one ``{"name": ..., **options}``."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value (dotted keys for options: attention.n_hashes=4), got {item!r}")
        *parents, leaf = key.strip().split(".")
        target = overrides
        for parent in parents:
            node = target.get(parent)
            target[parent] = {"name": node} if isinstance(node, str) else node if isinstance(node, dict) else {}
            target = target[parent]
        parsed = _literal(value.strip())
        if isinstance(target.get(leaf), dict) and isinstance(parsed, str):
            target[leaf] = {**target[leaf], "name": parsed}
        else:
            target[leaf] = parsed
    return overrides


def names(text: str | None, flag: str) -> list[str]:
    """A comma-separated list of names; options go in ``--variant``, never in parentheses."""
    out = [n.strip() for n in (text or "").split(",") if n.strip()]
    for name in out:
        if not name.replace("-", "_").isidentifier():
            raise ValueError(
                f"{flag}: {name!r} is not a name; give options as one variant of dotted key=value items, "
                "e.g. --variant attention=lsh attention.n_hashes=4 (model=<preset> picks the preset)"
            )
    return out


def peer_variant(name: str) -> Variant:
    """``x-transformers`` or ``x_transformers`` (the pip name or the registry's); labelled as given."""
    key = name.replace("-", "_")
    PEER.get(key)  # an unknown peer: the valid ones, and the closest
    return Variant(f"peer:{name}", "peer", key)


def named_variant(label: str) -> Variant:
    """``peer:<name>`` -> that peer; anything else -> that preset as registered."""
    return peer_variant(label[len("peer:") :]) if label.startswith("peer:") else Variant(label, "zoo", label)


def split_batch(tokens: Tensor) -> tuple[Tensor, Tensor]:
    """[batch, length + 1] -> inputs and targets [batch, length], each its own tensor as in a training
    batch: a slice would keep the whole [batch, length + 1] storage alive, and the activation meter
    (which counts storages) would report more than the trainer does for the same step."""
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def build(
    variant: Variant, length: int, shape: dict[str, int], overrides: dict[str, Any], device: torch.device | str = "cpu"
) -> tuple[nn.Module, Callable[[Tensor], Tensor]]:
    """The module (on ``device``) and a ``loss(tokens)`` closure for one training step.

    A zoo variant's config: its preset, then the bench's sizes, then the variant's overrides, then
    ``overrides`` (``--set``, for every variant), each merged by :func:`zoo.config.merge_config`.
    ``variant.compile``: the closure calls ``torch.compile(module)`` (compiled on its first call);
    ``variant.precision``: its forward (the loss included) runs under that autocast, as the trainer's."""
    torch.manual_seed(0)
    if variant.kind == "peer":
        if variant.checkpointing != "none":
            raise ValueError(f"{variant.label}: activation checkpointing applies to zoo stacks, not a peer's model")
        module = PEER.get(variant.name)(length, shape).to(device)
        forward = torch.compile(module) if variant.compile else module

        def peer_loss(tokens: Tensor) -> Tensor:
            inputs, targets = split_batch(tokens)
            with autocast(tokens.device, variant.precision):
                logits = forward(inputs)
                logits = getattr(logits, "logits", logits)  # an HF model returns an output object
                return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

        return module, peer_loss

    sizing = dict(
        vocab_size=shape["vocab"],
        d_model=shape["d_model"],
        n_heads=shape["heads"],
        n_layers=shape["layers"],
        d_ff=shape["d_ff"],
        dropout=0.0,
        max_len=max(length, 16),
    )
    config = resolve_preset(variant.name, sizing, variant.overrides, overrides)  # resolved once
    module = CheckpointPlan.parse(variant.checkpointing).apply(build_model(config).to(device))
    forward = torch.compile(module) if variant.compile else module

    def zoo_loss(tokens: Tensor) -> Tensor:
        with autocast(tokens.device, variant.precision):
            return total_loss(forward(**module.training_batch(tokens)))  # the head says what it is trained on

    return module, zoo_loss


def bench_tokens(vocab: int, batch: int, length: int, device: torch.device | str = "cpu") -> Tensor:
    """The token batch every variant at ``length`` steps on: [batch, length + 1] (inputs and targets)."""
    return torch.randint(0, vocab, (batch, length + 1), generator=torch.Generator().manual_seed(length)).to(device)


def add_variant_arguments(parser: argparse.ArgumentParser) -> None:
    """--attention, --model, --variant, --peers, --compile: what to measure."""
    parser.add_argument("--attention", help="comma-separated mechanisms, each in the --model skeleton (vanilla_lm)")
    parser.add_argument("--model", help="comma-separated presets; with --attention, a single preset is the skeleton")
    parser.add_argument(
        "--variant",
        action="append",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="one variant as dotted config overrides, e.g. "
        "--variant attention=lsh attention.n_hashes=8; "
        "model=<preset> picks the preset (default: the skeleton); repeat for more variants",
    )
    parser.add_argument("--peers", default="", help=f"comma-separated peer libraries: {', '.join(PEER.list())}")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also measure every variant under torch.compile, labelled <label>+compile",
    )
    parser.add_argument(
        "--precision",
        default="fp32",
        help="fp32, or bf16 (every step under bf16 autocast, on CUDA and CPU), or fp32,bf16: every variant "
        "beside its bf16 twin, labelled <label>+bf16 (with --paired: the bf16 speed-up per round)",
    )
    parser.add_argument(
        "--activation-checkpointing",
        default="none",
        help="none, full, selective (every 2nd block), selective:<k> or selective:attention (each block's "
        "attention sub-layer); several, comma-separated: every zoo variant beside its twins, labelled "
        "<label>+ac=<mode> (with --paired: each twin's time and activation MiB against the first mode's)",
    )


def variants_from_args(args: argparse.Namespace) -> list[Variant]:
    models = names(args.model, "--model")
    skeleton = "vanilla_lm"
    if args.attention and len(models) == 1:
        skeleton = models.pop()
    variants = [Variant(name, "zoo", skeleton, {"attention": name}) for name in names(args.attention, "--attention")]
    variants += [Variant(name, "zoo", name) for name in models]
    for items in args.variant:
        overrides = parse_set(items)
        variants.append(Variant(" ".join(items), "zoo", str(overrides.pop("model", skeleton)), overrides))
    variants += [peer_variant(name) for name in names(args.peers, "--peers")]
    if not variants:
        raise SystemExit("nothing to measure: give --attention, --model and/or --variant (and optionally --peers)")
    labels = [v.label for v in variants]
    if len(set(labels)) < len(labels):
        raise SystemExit(f"two variants share a label: {', '.join(sorted({x for x in labels if labels.count(x) > 1}))}")
    modes = checkpointing_list(getattr(args, "activation_checkpointing", "none"))
    plain, variants = [replace(v, checkpointing=modes[0]) for v in variants], []
    for v in plain:  # each zoo variant beside its twins under the other plans (a peer has no zoo stack)
        variants.append(v)
        if v.kind == "zoo":
            variants += [replace(v, label=f"{v.label}+ac={mode}", checkpointing=mode) for mode in modes[1:]]
    precisions = precision_list(getattr(args, "precision", "fp32"))
    variants = [replace(v, precision=precisions[0]) for v in variants]
    for precision in precisions[1:]:  # each one beside its twin at another precision
        variants = [w for v in variants for w in (v, replace(v, label=f"{v.label}+{precision}", precision=precision))]
    if getattr(args, "compile", False):  # each one beside its compiled self
        variants = [w for v in variants for w in (v, replace(v, label=f"{v.label}+compile", compile=True))]
    return variants


def precision_list(text: str) -> list[str]:
    """``--precision``: ``fp32``, ``bf16`` or ``fp32,bf16`` (the first is the unlabelled one)."""
    precisions = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad or not precisions or len(set(precisions)) < len(precisions):
        raise ValueError(f"--precision takes {', '.join(PRECISIONS)} or fp32,bf16 (no repeats); got {text!r}")
    return precisions


def checkpointing_list(text: str) -> list[str]:
    """``--activation-checkpointing``: plans (:meth:`CheckpointPlan.parse`), the first unlabelled, as specs."""
    modes = [CheckpointPlan.parse(m).spec for m in text.split(",") if m.strip()]
    if not modes or len(set(modes)) < len(modes):
        raise ValueError(f"--activation-checkpointing takes one or more distinct modes; got {text!r}")
    return modes
