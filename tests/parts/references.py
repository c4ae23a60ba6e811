"""Reference implementations we did not write, loaded for the equality tests (skipped when absent).

- mlpen/Nystromformer ``LRA/code`` (the PyTorch LRA re-implementations of Linformer, Performer,
  Nystromformer and linear attention), fetched outside the repository at commit 56893131:
  ``$ZOO_REFERENCES/Nystromformer`` (default: ``../ref/Nystromformer`` beside the checkout), e.g.
  ``git clone https://github.com/mlpen/Nystromformer ../ref/Nystromformer``.
- HF ``transformers`` (Longformer, BigBird, Mamba-2, Qwen3-Next): ``pip install -e ".[references]"``.
- fla-org/flash-linear-attention at commit bc3b101d: ``$ZOO_REFERENCES/flash-linear-attention``, e.g.
  ``git clone https://github.com/fla-org/flash-linear-attention ../ref/flash-linear-attention``; only the
  pure-PyTorch ``fla/ops/<op>/naive.py`` files are loaded (they import torch and einops, nothing of fla).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

PROJECT_ROOT = Path(__file__).resolve().parents[2]
REFERENCES = Path(os.environ.get("ZOO_REFERENCES", PROJECT_ROOT.parent / "ref"))
FLA_OPS = REFERENCES / "flash-linear-attention" / "fla" / "ops"
NYSTROMFORMER_LRA = REFERENCES / "Nystromformer" / "LRA" / "code"


def _module(path: Path, key: str, missing: str) -> ModuleType:
    """The file at ``path`` as a module (cached as ``key``); skips the test, saying ``missing``, when absent."""
    if not path.is_file():
        pytest.skip(f"{missing}: {path} is missing (set ZOO_REFERENCES)")
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[key] = module
    return sys.modules[key]


def mlpen_module(name: str) -> ModuleType:
    """``LRA/code/<name>.py`` of mlpen/Nystromformer as a module; skips the test when it is not fetched."""
    return _module(NYSTROMFORMER_LRA / f"{name}.py", f"mlpen_lra_{name}", "mlpen/Nystromformer not fetched")


class _Float64Torch:
    """``torch`` with ``float32`` and ``float`` meaning float64, for a reference module whose functions cast
    their inputs with ``.to(torch.float32)``: the same algorithm run in float64 (a ``.float()`` method call
    still casts to float32; the tests say where a function does that)."""

    float32 = torch.float64
    float = torch.float64

    def __getattr__(self, name: str):
        return getattr(torch, name)


def fla_naive(op: str, float64: bool = False) -> ModuleType:
    """``fla/ops/<op>/naive.py`` of flash-linear-attention as a module; skips the test when it is not fetched.
    ``float64``: a copy whose ``torch.float32`` is float64 (:class:`_Float64Torch`)."""
    key = f"fla_naive_{op}{'_float64' if float64 else ''}"
    fresh = key not in sys.modules
    module = _module(FLA_OPS / op / "naive.py", key, "flash-linear-attention not fetched")
    if float64 and fresh:
        module.torch = _Float64Torch()
    return module
