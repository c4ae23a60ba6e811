"""Reference implementations we did not write, loaded for the equality tests (skipped when absent).

- mlpen/Nystromformer ``LRA/code`` (the PyTorch LRA re-implementations of Linformer, Performer,
  Nystromformer and linear attention), fetched outside the repository at commit 56893131:
  ``$ZOO_REFERENCES/Nystromformer`` (default: ``../ref/Nystromformer`` beside the checkout), e.g.
  ``git clone https://github.com/mlpen/Nystromformer ../ref/Nystromformer``.
- HF ``transformers`` (Longformer, BigBird): ``pip install -e ".[references]"``.
- fla-org/flash-linear-attention at commit bc3b101d: ``$ZOO_REFERENCES/flash-linear-attention``; only its
  pure-PyTorch ``fla/ops/<op>/naive.py`` files are loaded, by path (they import torch and einops only, not
  the fla package or triton), e.g. ``git clone https://github.com/fla-org/flash-linear-attention``.
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
FLA_OPS = REFERENCES / "flash-linear-attention" / "fla" / "ops"


def mlpen_module(name: str) -> ModuleType:
    """``LRA/code/<name>.py`` of mlpen/Nystromformer as a module; skips the test when it is not fetched."""
    return module_at(NYSTROMFORMER_LRA / f"{name}.py", f"mlpen_lra_{name}", "mlpen/Nystromformer")


def fla_naive(op: str) -> ModuleType:
    """``fla/ops/<op>/naive.py`` of flash-linear-attention (pure PyTorch) as a module; skips when not fetched."""
    return module_at(FLA_OPS / op / "naive.py", f"fla_naive_{op}", "flash-linear-attention")


def module_at(path: Path, key: str, what: str) -> ModuleType:
    """The Python file at ``path`` as module ``key`` (loaded once); skips the test when it is missing."""
    if not path.is_file():
        pytest.skip(f"{what} not fetched: {path} is missing (set ZOO_REFERENCES)")
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[key] = module
    return sys.modules[key]
