"""Hydra structured-config schemas generated from the registries.

Every config group node is backed by a dataclass registered in Hydra's ConfigStore under
``schema/...``, and each YAML file starts with ``defaults: [/schema/<group>/<name>@_here_, _self_]``.
OmegaConf then type-checks values and, because structured configs are closed, refuses a key the
schema lacks at compose time (``attention.n_hashs=8``). The schemas are generated, never hand-written:

- ``schema/<axis>/<name>`` for each part axis (``attention``, ``residual``, ``stack``, ``position``,
  ``norm``, ``feed_forward``, ``init``):
  ``name`` + the fields of ``<REGISTRY>.get(name).Options``, every one optional with default null.
  Null means *unset*: the preset's own value when the preset uses that part, else the part's
  default. Anything else is a value the user (or an experiment file) set, and it reaches the model
  even when it equals the default ("set == runs");
- ``schema/data/<name>``: ``name`` + the fields of ``TASK.get(name).Options`` (filled: a task has
  no preset to defer to);
- ``schema/model``: ``preset`` + every ``ModelConfig`` field as optional (null = the preset's value);
- ``schema/trainer``, ``schema/optim``, ``schema/logger``: :mod:`zoo.train.trainer`'s option dataclasses.

A new mechanism or task therefore needs no schema code, only its ``Options`` dataclass.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import MISSING, dataclass, field, make_dataclass
from typing import Any, Optional, Union

from omegaconf import MISSING as REQUIRED  # '???': a value the config must supply

from zoo.attention.base import ATTENTION
from zoo.config import ModelConfig, field_types, require
from zoo.data import TASK
from zoo.feed_forward.base import FEED_FORWARD
from zoo.init.base import INIT
from zoo.norm.base import NORM
from zoo.position.base import POSITION
from zoo.presets import MODEL
from zoo.registry import Registry
from zoo.residual.base import RESIDUAL
from zoo.stacks.base import STACK
from zoo.train.options import OptimOptions, TrainerOptions

SIMPLE = (int, float, bool, str)

# the part axes that are config groups of their own: attention=lsh, residual=gru_gate, ... (the
# decoder's cross_attention stays a model key: model.cross_attention={name: ..., ...})
PART_GROUPS: dict[str, Registry[Any]] = {
    "attention": ATTENTION,
    "residual": RESIDUAL,
    "stack": STACK,
    "position": POSITION,
    "norm": NORM,
    "feed_forward": FEED_FORWARD,
    "init": INIT,
}


def schema_type(tp: Any) -> Any:
    """Map a Python annotation to one OmegaConf can enforce (anything exotic -> Any)."""
    if tp is Any or tp in SIMPLE:
        return tp
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            inner = schema_type(rest[0])
            return Optional[inner] if len(rest) < len(args) else inner  # noqa: UP045 - a runtime type for OmegaConf
        return Any
    if origin in (list, tuple, typing.Sequence, set, frozenset) or tp in (list, tuple):
        elem = [a for a in args if a is not Ellipsis]
        if len(set(elem)) == 1 and elem[0] in SIMPLE:
            return list[elem[0]]
        return list[Any]
    if origin is dict or tp is dict:
        return dict[str, Any]
    return Any


def field_default(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return MISSING
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, enum.Enum):
        return value
    return value


def options_fields(cls: type) -> list[tuple[str, Any, Any]]:
    """(name, schema type, default) for each field of an ``Options`` dataclass."""
    hints = field_types(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        default = field_default(f)
        out.append((f.name, schema_type(hints.get(f.name, Any)), default))
    return out


def options_defaults(cls: type) -> dict[str, Any]:
    return {name: default for name, _, default in options_fields(cls) if default is not MISSING}


def _as_field(default: Any) -> Any:
    if default is MISSING:
        return field(default=REQUIRED)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d))
    return field(default=default)


def optional(tp: Any) -> Any:
    """``tp`` that also accepts null (Any already does)."""
    return tp if tp is Any else Optional[tp]  # noqa: UP045 - a runtime type for OmegaConf


def named_schema(kind: str, name: str, options_cls: type, *, unset: bool = False) -> type:
    """A dataclass ``name`` + the options of one registered part.

    ``unset=True`` (the part groups): every option is optional with default null = not set, so
    only what a user sets is passed on; else the ``Options`` defaults fill the node."""
    fields = [("name", str, field(default=name))]
    for fname, tp, default in options_fields(options_cls):
        if fname == "name":
            raise ValueError(
                f"{kind} {name!r}: an Options field may not be called 'name' (the config key that picks the part)"
            )
        fields.append((fname, optional(tp), field(default=None)) if unset else (fname, tp, _as_field(default)))
    return make_dataclass(f"{kind.capitalize()}Schema_{name}", fields)


PRESET_CHOICE = "preset"  # each part group's default option: the preset's own part, its options settable


def preset_schema(axis: str, registry: Registry[Any]) -> type:
    """The default node of a part group (``attention: preset``): no ``name`` (the preset's own part(s),
    every layer's) and every option of every registered part of the axis, null = unset. So
    ``attention.n_kv_heads=1`` composes without picking a mechanism and reaches the preset's; an option
    the preset's part lacks is refused when the model is built, naming the part and its options. An
    option that two parts type differently is typed ``Any`` here (the part's own Options check it)."""
    types_of: dict[str, set[Any]] = {}
    for name in registry.list():
        for fname, tp, _ in options_fields(registry.get(name).Options):
            types_of.setdefault(fname, set()).add(tp)
    fields = [("name", Optional[str], field(default=None))]  # noqa: UP045 - a runtime type for OmegaConf
    for fname, tps in types_of.items():
        fields.append((fname, optional(next(iter(tps))) if len(tps) == 1 else Any, field(default=None)))
    return make_dataclass(f"{axis.capitalize()}Schema_preset", fields)


def model_schema() -> type:
    """``preset`` + ``tiny`` (start from the preset's registered CPU-sized variant, e.g. its attention
    blocks shrunk to fit short sequences) + every ModelConfig field as optional: null keeps the
    preset's (or the tiny variant's) value."""
    hints = field_types(ModelConfig)
    fields: list[tuple[str, Any, Any]] = [
        ("preset", str, field(default=REQUIRED)),
        ("tiny", bool, field(default=False)),
    ]
    for f in dataclasses.fields(ModelConfig):
        if f.name == "name":
            continue
        tp = schema_type(hints[f.name])
        fields.append((f.name, Any if tp == dict[str, Any] else optional(tp), field(default=None)))
    return make_dataclass("ModelSchema", fields)


def simple_schema(cls: type, name: str) -> type:
    fields = [(fname, tp, _as_field(default)) for fname, tp, default in options_fields(cls)]
    return make_dataclass(name, fields)


@dataclass
class LoggerOptions:
    """``logger.*``: ``wandb`` (offline by default: no network, no account; ``wandb sync`` later),
    ``csv`` (local files only) or ``none``. Local ``metrics.jsonl``/``metrics.csv`` are written
    for wandb and csv alike, so nothing depends on wandb to be read."""

    name: str = "wandb"
    project: str = "transformer-zoo"
    mode: str = "offline"  # offline | online | disabled
    entity: str = ""
    group: str = ""  # default: the multirun's directory name
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:

        require(self.name in ("wandb", "csv", "none"), f"logger.name must be wandb, csv or none, got {self.name!r}")
        require(
            self.mode in ("offline", "online", "disabled"),
            f"logger.mode must be offline, online or disabled, got {self.mode!r}",
        )


@dataclass
class SweepOptions:
    """``sweep.*``: how a multirun is launched and compared (``sweep=<name>`` picks a named multirun;
    these are its settings). See :mod:`zoo.app.sweep_dir` and :mod:`zoo.app.aggregate`."""

    # continue the multirun in hydra.sweep.dir: finished jobs kept, interrupted ones resumed from
    # their last.pt, the others run; the sweep's overrides must be the same as at its first launch
    resume: bool = False
    # the variant every other one is compared with, seed by seed: key:value[,key:value...]
    # (e.g. attention:vanilla or model:vanilla_lm); empty = no comparison
    baseline: str = ""
    # the search a job is a trial of (set by hparams_search=optuna and sweep=tuned_compare): its
    # trials are listed best first, not compared as variants; empty = not a trial
    search: str = ""


@dataclass
class RootSchema:
    """The top level: one node per config group plus run-wide keys."""

    model: Any = REQUIRED
    attention: Any = None  # null: the preset's mechanism; a choice swaps it
    residual: Any = None  # null: the preset's residual policy; likewise
    stack: Any = None  # null: the preset's stack; likewise
    position: Any = None  # null: the preset's position signal; likewise
    norm: Any = None  # null: the preset's norm; likewise
    feed_forward: Any = None  # null: the preset's feed-forward part; likewise
    init: Any = None  # null: the preset's initialisation scheme; likewise
    data: Any = REQUIRED
    optim: Any = REQUIRED
    trainer: Any = REQUIRED
    logger: Any = REQUIRED
    seed: int = 0
    # your own modules, imported before the config is composed so their parts are group options
    # (imports=[my_research.attention] attention=my_attention); recorded so evaluate/sample re-import them
    imports: list[str] = field(default_factory=list)
    name: str = ""  # run name (default: made from the command-line overrides)
    tags: list[str] = field(default_factory=list)  # free-form labels: in config.json, the sweep summary and wandb
    sweep: SweepOptions = field(default_factory=SweepOptions)
    data_dir: str = "../shared/data"  # where real data sets live (relative: to the project root)
    experiment: str | None = None  # set by experiment/* configs, for the record
    paper: Any = None  # experiment/paper/* configs: the paper's figures and protocol (zoo/app/paper.py)
    lra_setting: Any = None  # lra_setting/* configs: whose LRA setting a run follows, its per-task table


def is_zoo_part(obj: Any) -> bool:
    """Whether a registered part (or preset) is one of the zoo's own, whose group option is a
    generated YAML file in ``conf/``; a part of your own package has none."""
    module = getattr(obj, "build_config", obj).__module__  # a preset: where its function lives
    return module == "zoo" or module.startswith("zoo.")


def registered_parts() -> tuple:
    """What the schemas are generated from: every registered part, task and preset with its Options (the
    objects themselves, so an entry replaced under the same name differs)."""
    registries = [*PART_GROUPS.values(), TASK, MODEL]
    return tuple(
        tuple((name, r.get(name), getattr(r.get(name), "Options", None)) for name in r.list()) for r in registries
    )


_stored_from: tuple | None = None  # registered_parts() when the schemas were last stored


def register_schemas() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent: re-storing replaces).

    A part, task or preset registered outside the zoo (a module named in ``imports=``, an installed
    entry point) also becomes a group option of its own (``attention=my_attention``): the same
    generated node a YAML file in ``conf/`` would hold, so it needs no file. Storing every node costs
    0.3-0.8 s, so it is skipped while the registries hold what they held last time (every compose calls this)."""
    from hydra.core.config_store import ConfigStore

    global _stored_from
    cs = ConfigStore.instance()
    parts = registered_parts()
    if parts == _stored_from and "root_schema.yaml" in cs.repo:
        return
    cs.store(name="root_schema", node=RootSchema)
    model = model_schema()
    cs.store(group="schema", name="model", node=model)
    cs.store(group="schema", name="trainer", node=simple_schema(TrainerOptions, "TrainerSchema"))
    cs.store(group="schema", name="optim", node=simple_schema(OptimOptions, "OptimSchema"))
    cs.store(group="schema", name="logger", node=simple_schema(LoggerOptions, "LoggerSchema"))
    for axis, registry in PART_GROUPS.items():
        cs.store(group=axis, name=PRESET_CHOICE, node=preset_schema(axis, registry))
        for name in registry.list():
            schema = named_schema(axis, name, registry.get(name).Options, unset=True)
            cs.store(group=f"schema/{axis}", name=name, node=schema)
            if not is_zoo_part(registry.get(name)):
                cs.store(group=axis, name=name, node=schema)
    for name in TASK.list():
        schema = named_schema("data", name, TASK.get(name).Options)
        cs.store(group="schema/data", name=name, node=schema)
        if not is_zoo_part(TASK.get(name)):
            cs.store(group="data", name=name, node=schema)
    for name in MODEL.list():
        if not is_zoo_part(MODEL.get(name)):
            node = make_dataclass(f"ModelSchema_{name}", [("preset", str, field(default=name))], bases=(model,))
            cs.store(group="model", name=name, node=node)
    _stored_from = parts


def to_options(options_cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """Config values -> constructor kwargs: lists back to tuples where the default is a tuple."""
    out = dict(values)
    for f in dataclasses.fields(options_cls):
        if f.name in out and isinstance(out[f.name], list):
            default = (
                f.default
                if f.default is not MISSING
                else (f.default_factory() if f.default_factory is not MISSING else None)
            )  # type: ignore[misc]
            if isinstance(default, tuple):
                out[f.name] = tuple(out[f.name])
    return out
