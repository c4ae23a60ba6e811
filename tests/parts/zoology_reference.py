"""HazyResearch/zoology (commit d88d6f54) loaded by path from ``$ZOO_REFERENCES/zoology``; skips when absent.

Its data generators import the package's own modules (``zoology.config`` for the pydantic config
classes, ``zoology.utils``, ``zoology.data.utils`` for ``DataSegment``); those files are loaded by path
too, under their own names, with empty package modules for ``zoology`` and ``zoology.data`` so that
the package's ``__init__`` files (and everything they pull in) are not run. Nothing is stubbed.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from tests.parts.references import REFERENCES

ZOOLOGY = REFERENCES / "zoology"
_NEEDED = ("zoology.utils", "zoology.config", "zoology.data.utils")


def _load(name: str) -> ModuleType:
    path = ZOOLOGY.joinpath(*name.split(".")).with_suffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def zoology_module(name: str) -> ModuleType:
    """``zoology/<name>.py`` (dotted, e.g. ``data.multiquery_ar``) as a module; skips when zoology or
    pydantic (its config classes) is absent."""
    if not (ZOOLOGY / "zoology" / "data" / "multiquery_ar.py").is_file():
        pytest.skip(f"HazyResearch/zoology not fetched: {ZOOLOGY} is missing (set ZOO_REFERENCES)")
    pytest.importorskip("pydantic", reason="zoology's config classes need pydantic")
    full = f"zoology.{name}"
    if full not in sys.modules:
        for package in ("zoology", "zoology.data"):
            if package not in sys.modules:
                module = ModuleType(package)
                module.__path__ = []  # a package with no files of its own: submodules come from sys.modules
                sys.modules[package] = module
        for dependency in _NEEDED:
            if dependency not in sys.modules:
                _load(dependency)
        _load(full)
    return sys.modules[full]
