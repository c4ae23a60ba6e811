"""Config dataclasses (plain types only) and the one place a preset + overrides is resolved.

A model config is the preset's values with the user's overrides merged on top, layer after layer
(:func:`resolve_model_config`: every caller, the app and ``zoo.create_model`` alike, goes through it
once). Each swappable part (attention, residual, stack, position) is a plain dict
``{"name": <registry name>, **options}``; the part's own ``Options`` dataclass validates the options
when the part is built (``zoo/options.py``), so an unknown key fails with the valid keys listed and a
did-you-mean, and a bad value fails with the allowed range. Everything here is plain Python (no Hydra),
so a checkpoint's stored config rebuilds the model with ``zoo.create_model(**config)``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zoo.options import (
    ArgumentTypeError,
    NoOptions,
    build_options,
    check_field_types,
    check_type,
    field_types,
    matches_type,
)
from zoo.registry import did_you_mean, unknown

IGNORE_INDEX = -100  # a target that is not scored (padding, prompt positions): the data/model contract
PART_AXES = ("attention", "cross_attention", "residual", "stack", "position", "norm", "feed_forward", "init")
# the model's ``activation`` key: the activation of the feed-forward parts that take one (mlp, sepconv)
ACTIVATIONS = ("relu", "gelu")
DEFAULT_ACTIVATION = "relu"
# classifier pooling (zoo/models/classifier.py pool): the mean over the real tokens, the first token, or the
# PyTorch LRA code's mean: padded outputs zeroed and averaged over the whole padded length
POOLINGS = ("mean", "first", "padded_mean")


def split_part(part: Mapping[str, Any] | str) -> tuple[str, dict[str, Any]]:
    """{"name": "lsh", "n_hashes": 8} -> ("lsh", {"n_hashes": 8}); "lsh" -> ("lsh", {})"""
    if isinstance(part, str):
        return part, {}
    options = dict(part)
    return options.pop("name"), options


def require(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``condition``: the one-line form of a config check."""
    if not condition:
        raise ValueError(message)


def check_activation_key(activation: str) -> None:
    """The model's ``activation``: relu or gelu; a feed-forward part's name there (swiglu) is pointed to
    the feed_forward axis."""
    if activation in ACTIVATIONS:
        return
    # the feed_forward axis imports this module, so the name is not looked up here: the message says where a
    # gated unit is chosen (zoo/feed_forward/base.py refuses an unknown feed_forward name with the list)
    raise ValueError(
        f"activation must be {' or '.join(ACTIVATIONS)}, got {activation!r}; a feed-forward part, such as the "
        f"gated units of Shazeer 2020 (arXiv:2002.05202), is chosen on the feed_forward axis: feed_forward={activation}"
    )


def legacy_transition(stack: dict[str, Any], feed_forward: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A config written before the feed-forward axis chose the universal stack's transition with
    ``stack.transition`` (ffn | sepconv) and ``stack.kernel_size``; the transition is now the
    ``feed_forward`` part: ``sepconv`` (its kernel_size) or the model's feed-forward (ffn). Returns
    (stack, feed_forward) without the old keys; refuses a sepconv transition beside another
    feed-forward than the default mlp (two choices of one sub-layer)."""
    if "transition" not in stack and "kernel_size" not in stack:
        return stack, feed_forward
    stack = dict(stack)
    transition, kernel_size = stack.pop("transition", None) or "ffn", stack.pop("kernel_size", None)
    require(
        transition in ("ffn", "sepconv"),
        f"transition must be one of ffn, sepconv (the universal stack's old key; the transition is now the "
        f"feed_forward axis: feed_forward=sepconv), got {transition!r}",
    )
    if transition == "ffn":
        require(
            kernel_size is None,
            f"kernel_size={kernel_size} applies only to transition='sepconv' (now feed_forward=sepconv with "
            "feed_forward.kernel_size); this stack's transition is 'ffn'",
        )
        return stack, feed_forward
    require(
        feed_forward.get("name") == "mlp",
        f"stack.transition='sepconv' (the universal stack's old key) chooses feed_forward=sepconv, but feed_forward "
        f"is {feed_forward.get('name')!r}: set feed_forward=sepconv and drop stack.transition",
    )
    options = {k: v for k, v in feed_forward.items() if k == "activation"}
    return stack, {"name": "sepconv", **options, **({} if kernel_size is None else {"kernel_size": kernel_size})}


@dataclass
class ModelConfig:
    """Resolved configuration of a model: a head (``kind``) plus one choice per axis.

    ``kind``: a head registered in ``zoo.models.HEAD`` (checked when a preset is resolved):
    ``lm`` (decoder-only causal LM), ``classifier`` (encoder + pooling), ``seq2seq``
    (encoder-decoder), ``pair_classifier`` (LRA's two-tower retrieval model), or a plugin's own.
    Defaults are the base Transformer of Vaswani et al. 2017.
    """

    name: str = "vanilla_lm"
    kind: str = "lm"
    # "none": no output projection, logits None; use ModelOutput.hidden as a backbone. Classifiers also take
    # "mlp": Linear(d, d_ff) -> ReLU -> Linear(d_ff, n_classes), the PyTorch LRA code's head (zoo/models/classifier.py)
    head: str = "linear"
    vocab_size: int = 256
    d_model: int = 512
    n_layers: int = 6
    n_heads: int = 8
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    # the activation of a feed-forward part that takes one and leaves it unset (mlp, sepconv): kept as a model
    # key so existing presets and checkpoints build; feed_forward.activation says the same per part
    activation: str = DEFAULT_ACTIVATION
    ff_chunk_size: int = 0  # 0 = whole sequence at once; any feed-forward part (zoo/feed_forward/base.py)
    max_len: int = 4096  # learned position table size; a sequence past it is refused
    tie_embeddings: bool = True
    # token table: 0 = weights N(0, 1/d) read times sqrt(d) (rows at RMS 1, Vaswani et al.); > 0 = a plain
    # table N(0, token_init_std) read unscaled (BERT, the PyTorch LRA code: 0.02). zoo/models/base.py
    token_init_std: float = 0.0
    label_smoothing: float = 0.0
    # one part for every layer, or a list of per-layer parts (names or dicts), cycled over the layers:
    # ["local_1d", "local_1d", "local_1d", "vanilla"] (a hybrid; see layer_parts)
    attention: dict | list = field(default_factory=lambda: {"name": "vanilla"})
    cross_attention: dict = field(default_factory=lambda: {"name": "vanilla"})
    residual: dict = field(default_factory=lambda: {"name": "post_norm"})
    stack: dict = field(default_factory=lambda: {"name": "sequential"})
    position: dict = field(default_factory=lambda: {"name": "sinusoidal"})
    # the normalisation every residual policy, the final norm and a mechanism's own norms build (zoo/norm)
    norm: dict = field(default_factory=lambda: {"name": "layernorm"})
    # the sub-layer after attention in every block (zoo/feed_forward): mlp, swiglu, geglu, reglu, sepconv, ...
    feed_forward: dict = field(default_factory=lambda: {"name": "mlp"})
    # how the built model's weights are drawn (zoo/init): default = every part's own; gpt2 = N(0, 0.02), depth-scaled
    init: dict = field(default_factory=lambda: {"name": "default"})
    # LM head: {} = full softmax; {"cutoffs": [...], "div_val": ..., "tie_projections": ...} = adaptive
    # input + adaptive softmax (Baevski & Auli 2019; Grave et al. 2017), see zoo/models/adaptive_softmax.py
    adaptive: dict = field(default_factory=dict)
    # LM training losses of Al-Rfou et al. 2018 (zoo/models/al_rfou_losses.py): {} = off; {"intermediate": true,
    # "multi_target": 0.5} = the paper's intermediate-layer and character-after-next losses
    aux_losses: dict = field(default_factory=dict)
    # classifier head
    n_classes: int = 2
    pooling: str = "mean"
    # padded_mean's divisor, the length the input is padded to (0 = the input's own length t): the PyTorch
    # LRA code cuts Text and Retrieval at 1,000 / 4,000 bytes and pads to 1,024 / 4,096
    pool_length: int = 0
    # encoder-decoder
    n_encoder_layers: int = 0  # 0 = n_layers
    src_vocab_size: int = 0  # 0 = vocab_size (shared vocabulary, three-way tying possible)
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        for axis in PART_AXES:
            part = getattr(self, axis)
            if axis in LAYERED_AXES and isinstance(part, Sequence) and not isinstance(part, str):
                setattr(self, axis, per_layer_parts(axis, part))
                continue
            setattr(self, axis, as_part(axis, part))
        self.stack, self.feed_forward = legacy_transition(self.stack, self.feed_forward)
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        check_field_types(ModelConfig, values, "model config")
        require(
            self.head in ("linear", "mlp", "none"),
            f"head must be linear (output projection), mlp (classifiers) or none (hidden states), got {self.head!r}",
        )
        for key in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len"):
            require(getattr(self, key) > 0, f"{key} must be a positive int, got {getattr(self, key)!r}")
        for key in ("ff_chunk_size", "n_encoder_layers", "src_vocab_size"):
            require(getattr(self, key) >= 0, f"{key} must be an int >= 0 (0 = default), got {getattr(self, key)!r}")
        require(
            self.n_classes >= 2,
            f"n_classes must be an int >= 2 (a classifier chooses between classes), got {self.n_classes!r}",
        )
        require(
            self.d_model % self.n_heads == 0, f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
        )
        require(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout}")
        require(
            0.0 <= self.attention_dropout < 1.0, f"attention_dropout must be in [0, 1), got {self.attention_dropout}"
        )
        check_activation_key(self.activation)
        require(self.pooling in POOLINGS, f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        require(self.pool_length >= 0, f"pool_length must be an int >= 0 (0 = input length), got {self.pool_length}")
        require(
            not self.pool_length or self.pooling == "padded_mean",
            f"pool_length divides padded_mean's sum; pooling is {self.pooling!r}: set pooling=padded_mean or "
            "leave pool_length at 0",
        )
        require(self.token_init_std >= 0.0, f"token_init_std must be >= 0 (0 = scaled), got {self.token_init_std}")
        require(0.0 <= self.label_smoothing < 1.0, f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        adaptive_ok = not self.adaptive or self.kind == "lm"
        require(adaptive_ok, f"adaptive (input + softmax) is an LM option; kind is {self.kind!r}")
        require(
            not (self.adaptive and self.token_init_std),
            "token_init_std sets the plain token table; adaptive input has its own clusters and scale "
            "(zoo/models/adaptive_softmax.py): leave token_init_std at 0",
        )
        if self.aux_losses:
            require(self.kind == "lm", f"aux_losses (Al-Rfou et al. 2018) is an LM option; kind is {self.kind!r}")
            # head="none" keeps them (weights load both ways); such a model refuses targets, so they never run
            require(not self.adaptive, "aux_losses needs the full softmax output head (adaptive={})")
        if self.kind == "seq2seq":  # decoding writes these ids into the target sequence
            for key in ("pad_id", "bos_id", "eos_id"):
                value = getattr(self, key)
                require(
                    0 <= value < self.vocab_size, f"{key} must lie in [0, vocab_size={self.vocab_size}), got {value}"
                )

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(dataclasses.asdict(self))


MODEL_KEYS = frozenset(f.name for f in dataclasses.fields(ModelConfig))
LAYERED_AXES = ("attention",)  # axes that also take a list of per-layer parts (hybrids)


def as_part(axis: str, part: Any) -> dict[str, Any]:
    """A part given as a name or a dict -> ``{"name": ..., **options}``."""
    if isinstance(part, str):  # "lsh" is shorthand for {"name": "lsh"}
        part = {"name": part}
    require(
        isinstance(part, Mapping) and "name" in part,
        f"{axis} must be a name or a dict with a 'name' key"
        + (", or a list of them (one per layer, cycled)" if axis in LAYERED_AXES else "")
        + f", got {part!r}",
    )
    return dict(part)


def per_layer_parts(axis: str, parts: Sequence[Any]) -> list[dict[str, Any]]:
    """A list of per-layer parts (names or dicts) -> a list of ``{"name": ..., **options}``."""
    require(len(parts) > 0, f"{axis}: a per-layer list needs at least one part (it is cycled over the layers)")
    return [as_part(f"{axis}[{i}]", part) for i, part in enumerate(parts)]


def layer_parts(part: dict[str, Any] | list[dict[str, Any]], n_layers: int) -> list[dict[str, Any]]:
    """The part of each of ``n_layers`` layers: one part for all, or a per-layer list cycled when shorter
    (``[a, a, a, b]`` over 8 layers: a a a b a a a b) and cut when longer."""
    parts = part if isinstance(part, list) else [part]
    return [dict(parts[i % len(parts)]) for i in range(n_layers)]


def part_label(part: dict[str, Any] | list[dict[str, Any]] | str) -> str:
    """A part's registry name, or a hybrid's names joined by '+' in layer order ("local_1d+local_1d+vanilla")."""
    if isinstance(part, str):
        return part
    return "+".join(p["name"] for p in part) if isinstance(part, list) else part["name"]


def merge_config(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Merge ``overrides`` over a preset's ``base`` dict.

    Nested dicts merge key by key, except that naming a different part swaps it: ``attention="lsh"``
    or ``attention={"name": "lsh", ...}`` replaces the preset's attention options (they belong to
    the old mechanism), while ``attention={"n_hashes": 8}`` tweaks the current one. ``attention`` also
    takes a list of per-layer parts (a hybrid, cycled over the layers), which replaces the part(s); over
    a hybrid, options without a name apply to every layer and a name swaps the hybrid for that part.
    Unknown top-level keys are refused with the valid ones and a did-you-mean.
    """
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if key not in MODEL_KEYS:
            raise unknown("model config key", key, MODEL_KEYS)
        if key in LAYERED_AXES and isinstance(value, Sequence) and not isinstance(value, str):
            merged[key] = per_layer_parts(key, value)  # a per-layer list replaces the part(s)
        elif key in LAYERED_AXES and isinstance(merged.get(key), list):
            require(
                isinstance(value, (str, Mapping)),
                f"{key} must be a registry name, a dict of options or a per-layer list, got {value!r}",
            )
            new = {"name": value} if isinstance(value, str) else dict(value)
            # naming a part swaps the whole hybrid for it; options alone apply to every layer
            merged[key] = dict(new) if "name" in new else [{**layer, **new} for layer in merged[key]]
        elif key in PART_AXES:
            old = merged.get(key, {})  # absent: a tweak stays a tweak ({"act": True} keeps the preset's stack)
            old = {"name": old} if isinstance(old, str) else dict(old)
            require(
                isinstance(value, (str, Mapping)), f"{key} must be a registry name or a dict of options, got {value!r}"
            )
            new = {"name": value} if isinstance(value, str) else dict(value)
            if "name" in new and new["name"] != old.get("name"):
                merged[key] = new
            else:
                merged[key] = {**old, **new}
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            # a dict of options (aux_losses, adaptive): the keys given change, the preset's others stay,
            # so aux_losses={"layer_heads": False} does not silently switch the preset's losses off
            merged[key] = {**merged[key], **copy.deepcopy(dict(value))}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def model_defaults() -> dict[str, Any]:
    """:class:`ModelConfig`'s field defaults as a plain dict (nothing validated, nothing built)."""
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        for f in dataclasses.fields(ModelConfig)
    }


class PresetSize(dict):
    """A layer of the preset's own sizes (its registered tiny variant, ``model.tiny=true``), not a user's
    ask: its ``max_len`` is a default like the preset's, raised to the longest sequence the model will be
    fed, so a tiny variant trains on whatever sequence the trainer sets."""


def resolve_model_config(
    name: str, preset: Mapping[str, Any], layers: Sequence[Mapping[str, Any]] = (), *, min_len: int = 0
) -> ModelConfig:
    """The one place a preset + overrides becomes a model config.

    ``ModelConfig``'s defaults, then ``preset`` (the values a preset sets), then each of ``layers``
    in order, each merged by :func:`merge_config` (nested dicts merge; naming a different part swaps
    it; a later layer wins). ``name`` is the preset's name whatever a layer says. ``min_len``: the
    longest sequence the model will be fed; ``max_len`` (the position table) is raised to it unless
    a layer sets ``max_len`` (then the model refuses longer sequences, as asked; a :class:`PresetSize`
    layer's ``max_len`` is raised like the preset's)."""
    merged = merge_config(model_defaults(), preset)
    for layer in layers:
        merged = merge_config(merged, {k: v for k, v in layer.items() if k != "name"})
    merged["name"] = name
    if (
        min_len
        and merged["max_len"] < min_len
        and not any("max_len" in layer and not isinstance(layer, PresetSize) for layer in layers)
    ):
        merged["max_len"] = min_len
    return ModelConfig(**merged)


__all__ = [
    "ACTIVATIONS",
    "DEFAULT_ACTIVATION",
    "ModelConfig",
    "PresetSize",
    "ArgumentTypeError",
    "layer_parts",
    "part_label",
    "NoOptions",
    "build_options",
    "check_field_types",
    "check_type",
    "did_you_mean",
    "field_types",
    "matches_type",
    "merge_config",
    "model_defaults",
    "require",
    "resolve_model_config",
    "split_part",
]
