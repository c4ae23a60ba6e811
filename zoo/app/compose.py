"""Composing the app's config: the command line's launch (:func:`launch`), outside ``@hydra.main``
(tests, describe), and the errors a reader can act on.

A launch composes through Hydra alone: nothing composes ahead of it. Two things are done before:

- the modules named by ``imports=[my_research.attention]`` are imported (their parts register
  themselves) and the schemas are registered, a part of your own becoming a group option
  (``attention=my_attention``) through :func:`zoo.app.schema.register_schemas`;
- Hydra is asked to let its failure through (``HYDRA_FULL_ERROR``) instead of printing it and
  exiting, so an unknown key is explained from Hydra's own exception (:func:`explain`): the node
  that refused the key is in it, with its valid keys and the composed root (the preset).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from zoo.app.schema import PART_GROUPS, register_schemas
from zoo.app.sweep_dir import LaunchRefused, SweepIncomplete
from zoo.presets import preset_config
from zoo.registry import did_you_mean, import_plugins
from zoo.train.output_checks import OutputNotWritable, os_error_cause, unwritable_reason

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
FULL_ERROR = "HYDRA_FULL_ERROR"  # Hydra re-raises instead of printing and exiting when it is set


def imports_of(overrides: list[str]) -> list[str]:
    """The modules ``imports=[a.b,c]`` names on a command line (every value of a sweep over it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep

    asked = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] == "imports"]
    names: list[str] = []
    for parsed in OverridesParser.create().parse_overrides(asked):
        value = parsed.value()
        for item in value.list if isinstance(value, ChoiceSweep) else [value]:
            names += [str(m) for m in (item if isinstance(item, list) else [item]) if m]
    return list(dict.fromkeys(names))


def prepare(overrides: list[str] = ()) -> list[str]:
    """Import the modules ``imports=`` names, then register the schemas (their parts included)."""
    names = import_plugins(imports_of(list(overrides)))
    register_schemas()
    return names


@contextlib.contextmanager
def hydra_context(conf_dir: str | Path = CONF_DIR, overrides: list[str] = ()) -> Iterator[None]:
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    prepare(overrides)
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

    with hydra_context(conf_dir, overrides):
        return hydra_compose(
            config_name=config_name, overrides=list(overrides), return_hydra_config=return_hydra_config
        )


def root_cause(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__):
        exc = exc.__cause__ or exc.__context__
    return exc


def explain(exc: BaseException, conf_dir: str | Path = CONF_DIR) -> str | None:
    """For a composition that failed on an unknown key, a message naming the key and listing the
    valid ones (or None: another failure, which Hydra reports itself). Read from the exception
    alone: OmegaConf's error carries the node that refused the key (its keys, its root)."""
    from hydra.errors import ConfigCompositionException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    cause = root_cause(exc)
    if not isinstance(exc, ConfigCompositionException):
        return None
    full_key, node = getattr(cause, "full_key", None) or "", getattr(cause, "parent_node", None)
    if full_key == "imports":
        return f"imports takes a list of modules, e.g. imports=[my_research.attention]: {cause}".split("\n")[0]
    if not isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        return None
    if not full_key or not isinstance(node, DictConfig):
        return None
    parent, _, key = full_key.rpartition(".")
    keys = sorted(str(k) for k in node.keys() if parent or k != "hydra")
    axis = parent.removeprefix("model.")
    if axis in PART_GROUPS and "name" not in keys:  # the part is null: the preset's own
        return unset_part_message(full_key, axis, key, node._get_root())
    if not keys:  # a null node
        group_dir = Path(conf_dir) / parent
        if parent and "." not in parent and group_dir.is_dir():
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


def unset_part_message(full_key: str, axis: str, key: str, cfg: Any) -> str:
    """An option of a part axis set before its group was picked (``residual.gate_bias=0`` or
    ``model.residual.gate_bias=0``): name the group choice to make, preferring the preset's own
    part, and the parts that have that option."""
    registry = PART_GROUPS[axis]
    having = [n for n in registry.list() if key in {f.name for f in dataclasses.fields(registry.get(n).Options)}]
    own = None
    with contextlib.suppress(Exception):  # an error message: the preset's own part if it can be told
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


def explain_overrides(overrides: list[str], conf_dir: str | Path = CONF_DIR) -> str | None:
    """Compose ``overrides`` once: None when they compose, else what :func:`explain` says (tests)."""
    try:
        compose(overrides, conf_dir=conf_dir)
    except Exception as exc:  # noqa: BLE001 - any composition problem: explain what we can
        return explain(exc, conf_dir) or f"{type(exc).__name__}: {exc}"
    return None


def hydra_overrides(argv: list[str]) -> list[str]:
    return [a for a in argv if not a.startswith("-") and "=" in a]


def launch(hydra_main: Callable[[], Any], argv: list[str]) -> Any:
    """Run a ``@hydra.main`` function for the command line ``argv``: ``imports=`` first, then
    Hydra composes and runs (nothing composes ahead of it). An unknown key, or a multirun
    refused for its sweep directory, ends the launch with ``error: <what to write instead>`` (exit
    status 2); a multirun whose jobs did not all finish ends with their list (exit status 1, after
    its summary); any other failure is reported as Hydra reports it (the trace from the job on,
    exit status 1)."""
    try:
        prepare(hydra_overrides(argv))
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    user_wants_trace = FULL_ERROR in os.environ
    os.environ[FULL_ERROR] = "1"
    try:
        return hydra_main()
    except LaunchRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except SweepIncomplete as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:
        message = explain(exc) or output_refusal(exc, argv)
        if message:
            print(f"error: {message}", file=sys.stderr)
            sys.exit(2)
        if user_wants_trace:
            raise
        report(exc)
    finally:
        if not user_wants_trace:
            os.environ.pop(FULL_ERROR, None)


def output_refusal(exc: BaseException, argv: list[str] = ()) -> str | None:
    """For Hydra failing to make or write the run's (or sweep's) directory, before any of the job ran
    (an ``OSError`` raised from Hydra's own code, or naming the directory ``argv`` asked for: a
    read-only file system, a parent that is a file, a file-size limit), the path and the cause; the
    app's own refusal (``OutputNotWritable``) as it is; None for any other failure."""
    if isinstance(exc, OutputNotWritable):
        return str(exc)
    if not isinstance(exc, OSError):
        return None
    modules = [frame.f_globals.get("__name__", "") for frame, _ in traceback.walk_tb(exc.__traceback__)]
    outside_stdlib = [m for m in modules if m.split(".")[0] not in {"os", "pathlib", "shutil", "io", "builtins"}]
    raised_by_hydra = bool(outside_stdlib) and outside_stdlib[-1].startswith("hydra.")
    if not raised_by_hydra and not is_output_dir(exc.filename, list(argv)):  # the job raised it: its own message stands
        return None
    path = exc.filename or "the run directory"
    cause = (unwritable_reason(path) if exc.filename else None) or os_error_cause(exc)
    return (
        f"cannot write the run's output to {path}: {cause}; choose another run directory "
        "(hydra.run.dir=..., or hydra.sweep.dir=... for a multirun)"
    )


def is_output_dir(path: Any, argv: list[str]) -> bool:
    """Whether ``path`` is (or is a parent of) the run or sweep directory the command line asked for."""
    if not path:
        return False
    path = Path(os.path.abspath(path))
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key in ("hydra.run.dir", "hydra.sweep.dir") and value:
            asked = Path(os.path.abspath(value))
            if path == asked or path in asked.parents:
                return True
    return False


def report(exc: BaseException) -> None:
    """Hydra's report of a failure, exit 1: its message alone for a composition error, else the
    trace from the job's own frames on."""
    from hydra.errors import CompactHydraException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(exc, CompactHydraException):
        sys.stderr.write(str(exc) + os.linesep)
        if isinstance(exc.__cause__, OmegaConfBaseException):
            sys.stderr.write(str(exc.__cause__) + os.linesep)
    else:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_name != "run_job":
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb.tb_next if tb is not None else exc.__traceback__)
    sys.stderr.write(f"\nSet the environment variable {FULL_ERROR}=1 for a complete stack trace.\n")
    sys.exit(1)
