"""The project's scripts (experiments/*.py, results/*/*.py) loaded as modules, for tests that call
their functions: they are files to run, not an importable package."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(path: str | Path) -> ModuleType:
    """A fresh module from ``path`` (relative to the project root unless absolute): each call executes
    the file again, so what one test patches on it does not leak into the next."""
    path = Path(path) if Path(path).is_absolute() else ROOT / path
    spec = importlib.util.spec_from_file_location(f"zoo_script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
