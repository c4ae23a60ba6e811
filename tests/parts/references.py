"""Reference implementations we did not write, loaded for the equality tests (skipped when absent).

- mlpen/Nystromformer ``LRA/code`` (the PyTorch LRA re-implementations of Linformer, Performer,
  Nystromformer and linear attention), fetched outside the repository at commit 56893131:
  ``$ZOO_REFERENCES/Nystromformer`` (default: ``../ref/Nystromformer`` beside the checkout), e.g.
  ``git clone https://github.com/mlpen/Nystromformer ../ref/Nystromformer``.
- HF ``transformers`` (Longformer, BigBird, Mamba-2, Qwen3-Next): ``pip install -e ".[references]"``.
- fla-org/flash-linear-attention at commit bc3b101d: ``$ZOO_REFERENCES/flash-linear-attention``; only its
  pure-PyTorch ``fla/ops/<op>/naive.py`` files are loaded, by path (they import torch and einops only, not
  the fla package or triton), e.g. ``git clone https://github.com/fla-org/flash-linear-attention``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from zoo.bench.peers import module_from_file

PROJECT_ROOT = Path(__file__).resolve().parents[2]
REFERENCES = Path(os.environ.get("ZOO_REFERENCES", PROJECT_ROOT.parent / "ref"))
NYSTROMFORMER_LRA = REFERENCES / "Nystromformer" / "LRA" / "code"
FLA_OPS = REFERENCES / "flash-linear-attention" / "fla" / "ops"


def mlpen_module(name: str) -> ModuleType:
    """``LRA/code/<name>.py`` of mlpen/Nystromformer as a module; skips the test when it is not fetched."""
    return module_at(NYSTROMFORMER_LRA / f"{name}.py", f"mlpen_lra_{name}", "mlpen/Nystromformer")


def fla_naive(op: str, float64: bool = False) -> ModuleType:
    """``fla/ops/<op>/naive.py`` of flash-linear-attention (pure PyTorch) as a module; skips when not fetched.
    ``float64``: a copy of its own whose ``torch.float32`` is float64 (:class:`Float64Torch`)."""
    if not float64:
        return module_at(FLA_OPS / op / "naive.py", f"fla_naive_{op}", "flash-linear-attention")
    key = f"fla_naive_{op}_float64"
    fresh = key not in sys.modules
    module = module_at(FLA_OPS / op / "naive.py", key, "flash-linear-attention")
    if fresh:
        module.torch = Float64Torch()
    return module


class Float64Torch:
    """``torch`` with ``float32`` and ``float`` meaning float64, for a reference module whose functions cast
    their inputs with ``.to(torch.float32)``: the same algorithm run in float64 (a ``.float()`` method call
    still casts to float32; the tests say where a function does that)."""

    float32 = torch.float64
    float = torch.float64

    def __getattr__(self, name: str):
        return getattr(torch, name)


def module_at(path: Path, key: str, what: str) -> ModuleType:
    """The Python file at ``path`` as module ``key`` (loaded once); skips the test when it is missing."""
    if not path.is_file():
        pytest.skip(f"{what} not fetched: {path} is missing (set ZOO_REFERENCES)")
    return module_from_file(path, key)
