"""Composing the app's config outside ``@hydra.main`` (tests, evaluate/sample, the CLI pre-check),
and turning a composition error about an unknown key into one that lists the valid keys."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from zoo.app.schema import PART_GROUPS, register_schemas
from zoo.presets.factory import preset_config
from zoo.registry import did_you_mean

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


@contextlib.contextmanager
def hydra_context(conf_dir: str | Path = CONF_DIR) -> Iterator[None]:
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


def compose(
    overrides: list[str] = (),
    *,
    config_name: str = "config",
    conf_dir: str | Path = CONF_DIR,
    return_hydra_config: bool = False,
) -> DictConfig:
    """The composed config for ``overrides`` (``["model=vanilla_lm", "trainer.max_steps=5"]``)."""
    from hydra import compose as hydra_compose

    with hydra_context(conf_dir):
        return hydra_compose(
            config_name=config_name, overrides=list(overrides), return_hydra_config=return_hydra_config
        )


def root_cause(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__):
        exc = exc.__cause__ or exc.__context__
    return exc


def _node_keys(cfg: DictConfig, path: str) -> list[str] | None:
    node = OmegaConf.select(cfg, path) if path else cfg
    return sorted(str(k) for k in node.keys()) if isinstance(node, DictConfig) else None


def explain_unknown_key(exc: BaseException, overrides: list[str], conf_dir: str | Path = CONF_DIR) -> str | None:
    """For an unknown-key error, a message naming the key and listing the valid ones (or None)."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    cause = root_cause(exc)
    if not isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        return None
    full_key = getattr(cause, "full_key", None) or ""
    if not full_key:
        return None
    parent, _, key = full_key.rpartition(".")
    bad_prefix = full_key.split("=")[0]
    keep = [o for o in overrides if not o.lstrip("+~").split("=")[0].startswith(bad_prefix)]
    try:
        cfg = compose(keep, conf_dir=conf_dir)
    except Exception:
        return None
    axis = parent.removeprefix("model.")
    if axis in PART_GROUPS and OmegaConf.select(cfg, parent) is None:
        return unset_part_message(full_key, axis, key, cfg)
    keys = _node_keys(cfg, parent)
    if keys is None:
        group_dir = Path(conf_dir) / parent
        if parent and "." not in parent and group_dir.is_dir() and OmegaConf.select(cfg, parent) is None:
            choices = sorted(p.stem for p in group_dir.glob("*.yaml"))
            example = choices[0] if choices else "<name>"
            return (
                f"cannot set {full_key!r}: '{parent}' is null; pick one first, "
                f"e.g. {parent}={example} {full_key}=...; choices: {', '.join(choices)}"
            )
        return None
    where = f"'{parent}'" if parent else "the top level"
    return (
        f"unknown config key {full_key!r}: {where} has no key {key!r}; "
        f"valid: {', '.join(keys)}.{did_you_mean(key, keys)}"
    )


def unset_part_message(full_key: str, axis: str, key: str, cfg: DictConfig) -> str:
    """An option of a part axis set before its group was picked (``residual.gate_bias=0`` or
    ``model.residual.gate_bias=0``): name the group choice to make, preferring the preset's own
    part, and the parts that have that option."""
    import dataclasses

    registry = PART_GROUPS[axis]
    having = [n for n in registry.list() if key in {f.name for f in dataclasses.fields(registry.get(n).Options)}]
    own = None
    with contextlib.suppress(Exception):
        own = getattr(preset_config(cfg.model.preset), axis)["name"]
    choices = ", ".join(registry.list())
    if not having:
        options = sorted({f.name for n in registry.list() for f in dataclasses.fields(registry.get(n).Options)})
        return (
            f"cannot set {full_key!r}: no {axis} has an option {key!r}; options: {', '.join(options) or '(none)'}."
            f"{did_you_mean(key, options)} Pick the part with {axis}=<name> ({choices}), then {axis}.<option>=..."
        )
    example = own if own in having else having[0]
    own_group = full_key.startswith(axis)
    where = f"'{axis}' is null (the preset's own choice)" if own_group else f"'{axis}' is a config group of its own"
    return (
        f"cannot set {full_key!r}: {where}; pick the part first: {axis}={example} {axis}.{key}=... "
        f"({key!r} is an option of: {', '.join(having)}; {axis} choices: {choices})"
    )


def first_choice_overrides(overrides: list[str]) -> list[str]:
    """Overrides with each sweep replaced by its first value (globs dropped), for a pre-check."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep

    out = []
    for text, parsed in zip(overrides, OverridesParser.create().parse_overrides(overrides)):
        if not parsed.is_sweep_override():
            out.append(text)
            continue
        value = parsed.value()
        if isinstance(value, ChoiceSweep) and value.list:
            first = value.list[0]
            prefix = {"ADD": "+", "FORCE_ADD": "++"}.get(parsed.type.name, "")
            shown = first if isinstance(first, str) else OmegaConf.to_yaml(first).strip()
            out.append(f"{prefix}{parsed.get_key_element()}={shown}")
    return out


def precheck(argv: list[str], conf_dir: str | Path = CONF_DIR) -> str | None:
    """Compose the command line's config once before Hydra runs; a message for an unknown key."""
    overrides = [a for a in argv if not a.startswith("-") and "=" in a and not a.lstrip("+~").startswith("hydra")]
    try:
        overrides = first_choice_overrides(overrides)
        compose(overrides, conf_dir=conf_dir)
    except Exception as exc:  # noqa: BLE001 - any composition problem: explain what we can, let Hydra report the rest
        return explain_unknown_key(exc, overrides, conf_dir)
    return None
