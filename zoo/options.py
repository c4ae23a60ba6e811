"""A part's ``Options``: checked against their dataclass annotations and built, on the ground floor.

Every axis builds its parts' options through :func:`build_options` (unknown keys refused with the valid
ones and a did-you-mean, values of the wrong type refused naming the key), and call arguments are checked
with :func:`check_type` by the same rules; the model config (``config.py``) checks its fields so too.
Value checks (ranges) live in each dataclass's ``__post_init__``. Importable from ``zoo.config`` as well.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from zoo.registry import unknown


@dataclass
class NoOptions:
    """Options of a part that takes none."""


class ArgumentTypeError(TypeError, ValueError):
    """A config value or call argument of the wrong type (``causal="no"``, ``n_hashes=True``,
    ``max_len=2.5``). Subclasses both TypeError and ValueError, so callers catching either see it."""


# -- type checks derived from the dataclass annotations ------------------------------------------
# A dataclass annotation is the allowed type: ``bool`` takes only True/False (never 1 or "no"),
# ``int`` only integers (never True or 2.5), ``float`` any finite real number but a bool, ``str`` a
# string, ``list[float]`` a list/tuple of numbers, ``X | None`` also None.


def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass (strings under ``from __future__ import annotations``);
    a field whose annotation cannot be resolved here is ``Any`` (not checked)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an annotation naming something not importable here: resolve field by field
        module = vars(__import__(cls.__module__, fromlist=["_"]))
        out = {}
        for f in dataclasses.fields(cls):
            try:  # eval of our own dataclasses' annotation strings, as typing.get_type_hints does
                out[f.name] = eval(f.type, module, {}) if isinstance(f.type, str) else f.type
            except Exception:
                out[f.name] = Any
        return out


def sequence_element(tp: Any) -> Any:
    """The element type of ``list[X]`` / ``tuple[X, ...]`` / ``Sequence[X]`` (Any when mixed or bare)."""
    args = [arg for arg in typing.get_args(tp) if arg is not Ellipsis]
    return args[0] if len(set(args)) == 1 else Any


def matches_type(value: Any, tp: Any) -> bool:
    """Whether ``value`` is allowed by the annotation ``tp`` (rules above)."""
    if tp is Any or isinstance(tp, (str, typing.TypeVar)):
        return True
    if tp is type(None) or tp is None:
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if tp is str:
        return isinstance(value, str)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return any(matches_type(value, arg) for arg in args)
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        element = sequence_element(tp)
        is_sequence = isinstance(value, Sequence) and not isinstance(value, (str, bytes))
        return is_sequence and all(matches_type(v, element) for v in value)
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return isinstance(value, Mapping)
    return isinstance(value, tp) if isinstance(tp, type) else True


def type_name(tp: Any) -> str:
    """'an int', 'a bool (True or False)', 'a list of numbers', 'an int or None' ..."""
    names = {
        bool: "a bool (True or False)",
        int: "an int",
        float: "a finite number",
        str: "a string",
        type(None): "None",
    }
    if tp in names:
        return names[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(arg) for arg in args)
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        plural = {bool: "bools", int: "ints", float: "numbers", str: "strings"}
        return f"a list of {plural.get(sequence_element(tp), 'values')}"
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return "a mapping"
    return f"a {getattr(tp, '__name__', tp)}"


def check_type(value: Any, tp: Any, key: str, what: str = "") -> None:
    """Raise :class:`ArgumentTypeError` naming ``key`` (and ``what`` it belongs to) unless ``value``
    is allowed by the annotation ``tp``."""
    if not matches_type(value, tp):
        where = f"{what}: " if what else ""
        raise ArgumentTypeError(f"{where}{key} must be {type_name(tp)}, got {value!r} ({type(value).__name__})")


def check_field_types(cls: type, values: Mapping[str, Any], what: str, key_prefix: str = "") -> None:
    """Type-check ``values`` (key -> value) against the annotations of dataclass ``cls``."""
    hints = field_types(cls)
    for key, value in values.items():
        check_type(value, hints.get(key, Any), f"{key_prefix}{key}", what)


def build_options(options_cls: type, options: dict[str, Any], what: str, key_prefix: str = "") -> Any:
    """Instantiate a part's ``Options`` dataclass from ``options``, rejecting unknown keys and
    values of the wrong type (from the field annotations). ``key_prefix`` is how the app spells the
    keys in messages (``"data."`` gives ``data.split``).

    Value checks live in the dataclass's ``__post_init__`` so they run for every construction path.
    """
    valid = {f.name for f in dataclasses.fields(options_cls)}
    for key in options:
        if key not in valid:
            raise unknown(f"option for {what}", key, valid)
    check_field_types(options_cls, options, what, key_prefix)
    return options_cls(**options)
