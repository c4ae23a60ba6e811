"""Reference implementations we did not write, loaded for the equality tests (skipped when absent).

- mlpen/Nystromformer ``LRA/code`` (the PyTorch LRA re-implementations of Linformer, Performer,
  Nystromformer and linear attention), fetched outside the repository at commit 56893131:
  ``$ZOO_REFERENCES/Nystromformer`` (default: ``../ref/Nystromformer`` beside the checkout), e.g.
  ``git clone https://github.com/mlpen/Nystromformer ../ref/Nystromformer``.
- HF ``transformers`` (Longformer, BigBird): ``pip install -e ".[references]"``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
REFERENCES = Path(os.environ.get("ZOO_REFERENCES", PROJECT_ROOT.parent / "ref"))
NYSTROMFORMER_LRA = REFERENCES / "Nystromformer" / "LRA" / "code"


def mlpen_module(name: str) -> ModuleType:
    """``LRA/code/<name>.py`` of mlpen/Nystromformer as a module; skips the test when it is not fetched."""
    path = NYSTROMFORMER_LRA / f"{name}.py"
    if not path.is_file():
        pytest.skip(f"mlpen/Nystromformer not fetched: {path} is missing (set ZOO_REFERENCES)")
    key = f"mlpen_lra_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[key] = module
    return sys.modules[key]
