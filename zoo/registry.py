"""Name -> part registries (timm-style), the class every axis of a variant keeps its parts in.

Each axis defines its registry beside its base class (``ATTENTION`` in ``zoo/attention/base.py``,
``RESIDUAL``, ``STACK``, ``POSITION``, ``HEAD``, ``TASK``, the presets' ``MODEL``, the benchmark's
``PEER``). Parts register under a name with a decorator; a registry refuses a part that is not of
its axis's base class and a second part under a taken name (xFormers' registry refused both), and
every unknown name raises an error that lists the valid names and suggests the closest one, so a
typo in a config never ends in a ``KeyError`` from deep inside the library.

A package of parts registers every module it holds when it is imported (:func:`import_submodules`):
no hand-kept import lists. A researcher's own parts live in their own package and register the same
way when it is imported: :func:`import_plugins` imports modules by dotted name (the app's and the
benchmark's ``imports=``), and installed packages announce theirs in the entry-point group
``transformer_zoo.parts`` (:func:`load_entry_points`, called when ``zoo`` is imported).
"""

from __future__ import annotations

import difflib
import fnmatch
import importlib
import importlib.metadata
import pkgutil
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """An unknown registry name or config key. Subclasses both KeyError and ValueError so callers
    catching either one see it; ``str()`` gives the readable message rather than KeyError's repr."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """' Did you mean 'x'?' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.5)
    return f" Did you mean {close[0]!r}?" if close else ""


def unknown(what: str, name: str, choices: Iterable[str]) -> UnknownNameError:
    """Build the standard 'unknown X' error: the bad name, the valid ones, the closest one."""
    choices = sorted(choices)
    return UnknownNameError(
        f"unknown {what} {name!r}; valid: {', '.join(choices) or '(none)'}.{did_you_mean(name, choices)}"
    )


class Registry(Generic[T]):
    """A named collection of parts of one kind.

    >>> ATTENTION.register("vanilla")(VanillaAttention)   # or as a class decorator
    >>> ATTENTION.get("vanila")                             # raises, suggesting 'vanilla'
    """

    def __init__(self, kind: str, base: type | None = None):
        self.kind = kind
        self.base = base  # a registered class must subclass it (an instance: be one); None = anything
        self._entries: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        """Register ``obj`` under ``name``; usable as ``@REG.register("name")``.
        A name can be taken once: a second registration is a bug (two files claiming one name)."""

        def add(target: T) -> T:
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"{self.kind} name must be an identifier-like string, got {name!r}")
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered (by {self._entries[name]!r})")
            self.check_base(name, target)
            self._entries[name] = target
            # let a class know the name it is registered under (messages, configs); a subclass of a
            # registered class gets its own name, not its parent's
            if isinstance(target, type) and "registry_name" not in vars(target):
                try:
                    target.registry_name = name  # type: ignore[attr-defined]
                except TypeError:  # built-in types take no attributes
                    pass
            return target

        return add(obj) if obj is not None else add

    def check_base(self, name: str, target: Any) -> None:
        """Refuse a part that is not of this axis: a class must subclass ``base``, an instance be one."""
        if self.base is None:
            return
        fits = issubclass(target, self.base) if isinstance(target, type) else isinstance(target, self.base)
        if not fits:
            base = f"{self.base.__module__}.{self.base.__qualname__}"
            raise TypeError(f"{self.kind} {name!r}: {target!r} is not a {base}; a {self.kind} part must subclass it")

    def unregister(self, name: str) -> T:
        """Remove ``name`` and return what it held (tests and plugins that register for a while)."""
        self.get(name)  # the standard error for an unknown name
        return self._entries.pop(name)

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise unknown(self.kind, name, self._entries) from None

    def list(self, pattern: str = "*") -> list[str]:
        """Sorted names matching a shell-style ``pattern`` (``"sparse_*"``)."""
        return sorted(n for n in self._entries if fnmatch.fnmatchcase(n, pattern))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.list()})"


def import_submodules(package: str) -> list[str]:
    """Import every module of ``package`` (its parts register themselves on import): a part is added
    by adding its file. Modules whose name starts with ``_`` are skipped. Returns the names imported."""
    module = importlib.import_module(package)
    names = sorted(info.name for info in pkgutil.iter_modules(module.__path__) if not info.name.startswith("_"))
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return names


ENTRY_POINT_GROUP = "transformer_zoo.parts"  # installed packages name their part modules here


def import_plugins(modules: Iterable[str]) -> list[str]:
    """Import a researcher's own modules by dotted name (``["my_research.attention"]``); each registers
    its parts on import, as the zoo's own do. A module that cannot be imported raises ImportError
    naming it and saying how to make it importable. Returns the names imported."""
    names = [str(m) for m in modules if str(m).strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            raise ImportError(
                f"imports: cannot import {name!r} ({exc}); install its package (pip install -e .) or add its "
                "directory to PYTHONPATH"
            ) from exc
    return names


def load_entry_points(group: str = ENTRY_POINT_GROUP) -> list[str]:
    """Import the part modules installed packages name in the entry-point ``group``
    (``[project.entry-points."transformer_zoo.parts"] my_attention = "my_research.attention"``).
    A broken one raises, naming the package: a part that fails to register is not skipped silently."""
    loaded = []
    for entry in importlib.metadata.entry_points(group=group):
        try:
            entry.load()
        except Exception as exc:
            dist = getattr(entry.dist, "name", "?")
            raise ImportError(
                f"entry point {entry.name!r} = {entry.value!r} of package {dist!r} failed: {exc}"
            ) from exc
        loaded.append(entry.value)
    return loaded
