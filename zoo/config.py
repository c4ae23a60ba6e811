"""Config dataclasses (plain types only) and the rules for merging overrides into them.

A model config is the preset's values with the user's overrides merged on top. Each swappable part
(attention, residual, stack, position) is a plain dict ``{"name": <registry name>, **options}``;
the part's own ``Options`` dataclass validates the options when the part is built, so an unknown
key fails with the valid keys listed and a did-you-mean, and a bad value fails with the allowed
range. Everything here is plain Python (no Hydra), so a checkpoint's stored config rebuilds the
model with ``zoo.create_model(**config)``.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from zoo.registry import did_you_mean, unknown

PART_AXES = ("attention", "cross_attention", "residual", "stack", "position")
KINDS = ("lm", "classifier", "seq2seq", "pair_classifier")  # heads in zoo.models.HEADS (pair: zoo.two_tower)


@dataclass
class NoOptions:
    """Options of a part that takes none."""


def build_options(options_cls: type, options: dict[str, Any], what: str) -> Any:
    """Instantiate a part's ``Options`` dataclass from ``options``, rejecting unknown keys.

    Value checks live in the dataclass's ``__post_init__`` so they run for every construction path.
    """
    valid = {f.name for f in dataclasses.fields(options_cls)}
    for key in options:
        if key not in valid:
            raise unknown(f"option for {what}", key, valid)
    return options_cls(**options)


def require(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``condition``: the one-line form of a config check."""
    if not condition:
        raise ValueError(message)


@dataclass
class ModelConfig:
    """Resolved configuration of a model: a head (``kind``) plus one choice per axis.

    ``kind``: ``lm`` (decoder-only causal LM), ``classifier`` (encoder + pooling), ``seq2seq``
    (encoder-decoder), ``pair_classifier`` (LRA's two-tower retrieval model). Defaults are the base
    Transformer of Vaswani et al. 2017.
    """

    name: str = "vanilla_lm"
    kind: str = "lm"
    head: str = "linear"  # "none": no output projection, logits None; use ModelOutput.hidden as a backbone
    vocab_size: int = 256
    d_model: int = 512
    n_layers: int = 6
    n_heads: int = 8
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation: str = "relu"
    ff_chunk_size: int = 0  # 0 = whole sequence at once
    max_len: int = 4096  # learned position table size; a sequence past it is refused
    tie_embeddings: bool = True
    label_smoothing: float = 0.0
    attention: dict = field(default_factory=lambda: {"name": "vanilla"})
    cross_attention: dict = field(default_factory=lambda: {"name": "vanilla"})
    residual: dict = field(default_factory=lambda: {"name": "post_norm"})
    stack: dict = field(default_factory=lambda: {"name": "sequential"})
    position: dict = field(default_factory=lambda: {"name": "sinusoidal"})
    # LM head: {} = full softmax; {"cutoffs": [...], "div_val": ..., "tie_projections": ...} = adaptive
    # input + adaptive softmax (Baevski & Auli 2019; Grave et al. 2017), see zoo/adaptive.py
    adaptive: dict = field(default_factory=dict)
    # LM training losses of Al-Rfou et al. 2018 (zoo/al_rfou.py): {} = off; {"intermediate": true,
    # "multi_target": 0.5} = the paper's intermediate-layer and character-after-next losses
    aux_losses: dict = field(default_factory=dict)
    # classifier head
    n_classes: int = 2
    pooling: str = "mean"
    # encoder-decoder
    n_encoder_layers: int = 0  # 0 = n_layers
    src_vocab_size: int = 0  # 0 = vocab_size (shared vocabulary, three-way tying possible)
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        require(self.kind in KINDS, f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        require(
            self.head in ("linear", "none"),
            f"head must be linear (output projection) or none (hidden states only), got {self.head!r}",
        )
        for key in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff"):
            require(isinstance(getattr(self, key), int) and getattr(self, key) > 0, f"{key} must be a positive int, got {getattr(self, key)!r}")
        require(self.d_model % self.n_heads == 0, f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        require(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout}")
        require(0.0 <= self.attention_dropout < 1.0, f"attention_dropout must be in [0, 1), got {self.attention_dropout}")
        require(self.activation in ("relu", "gelu"), f"activation must be relu or gelu, got {self.activation!r}")
        require(self.ff_chunk_size >= 0, f"ff_chunk_size must be >= 0 (0 = unchunked), got {self.ff_chunk_size}")
        require(self.pooling in ("mean", "first"), f"pooling must be mean or first, got {self.pooling!r}")
        require(0.0 <= self.label_smoothing < 1.0, f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        adaptive_ok = not self.adaptive or self.kind == "lm"
        require(adaptive_ok, f"adaptive (input + softmax) is an LM option; kind is {self.kind!r}")
        if self.aux_losses:
            require(self.kind == "lm", f"aux_losses (Al-Rfou et al. 2018) is an LM option; kind is {self.kind!r}")
            # head="none" keeps them (weights load both ways); such a model refuses targets, so they never run
            require(not self.adaptive, "aux_losses needs the full softmax output head (adaptive={})")
        for axis in PART_AXES:
            part = getattr(self, axis)
            if isinstance(part, str):  # "lsh" is shorthand for {"name": "lsh"}
                part = {"name": part}
            require(isinstance(part, dict) and "name" in part, f"{axis} must be a name or a dict with a 'name' key, got {part!r}")
            setattr(self, axis, dict(part))

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(dataclasses.asdict(self))


MODEL_KEYS = frozenset(f.name for f in dataclasses.fields(ModelConfig))


def merge_config(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Merge ``overrides`` over a preset's ``base`` dict.

    Nested dicts merge key by key, except that naming a different part swaps it: ``attention="lsh"``
    or ``attention={"name": "lsh", ...}`` replaces the preset's attention options (they belong to
    the old mechanism), while ``attention={"n_hashes": 8}`` tweaks the current one. Unknown top-level
    keys are refused with the valid ones and a did-you-mean.
    """
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if key not in MODEL_KEYS:
            raise unknown("model config key", key, MODEL_KEYS)
        if key in PART_AXES:
            old = merged.get(key, {})  # absent: a tweak stays a tweak ({"act": True} keeps the preset's stack)
            old = {"name": old} if isinstance(old, str) else dict(old)
            new = {"name": value} if isinstance(value, str) else dict(value)
            if "name" in new and new["name"] != old.get("name"):
                merged[key] = new
            else:
                merged[key] = {**old, **new}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


__all__ = [
    "ModelConfig",
    "NoOptions",
    "build_options",
    "did_you_mean",
    "merge_config",
    "require",
]
