"""Mixed precision: ``trainer.precision=bf16`` (and ``python -m zoo.bench --precision bf16``).

bf16 runs the forward pass under ``torch.autocast(<device>, dtype=torch.bfloat16)``, on CUDA and on
the CPU alike: matmuls and linear layers compute in bfloat16, while the weights, the optimiser,
the residual stream (a bfloat16 branch added to a float32 stream is float32), LayerNorm and the
losses stay float32. Nothing else changes, so a bf16 run trains the same model as an fp32 one.

bfloat16 keeps 8 significant bits: relative steps of 2^-8 and whole numbers exactly only up to
256. A part whose numerics need more computes that piece in float32 itself, with :func:`float32`
(autocast off, inputs raised to at least float32), and says why in a comment starting
``# float32:`` where it does (``grep -rn "# float32:" zoo`` lists them all).

Recomputation in backward (the reversible stack, ``zoo.attention.recompute``) replays the autocast
state the forward ran under (:class:`AutocastState`, as ``torch.utils.checkpoint`` does): backward
runs outside the autocast region, and recomputing in another precision would differentiate another
function (and rebuild the reversible stack's inputs wrongly).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

# trainer.precision / --precision -> the autocast dtype (None: plain float32, no autocast)
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}


def check_precision(precision: str, device: torch.device | str, key: str = "trainer.precision") -> None:
    """Refuse, naming ``key`` and the fix, a precision this device cannot run."""
    if precision not in PRECISIONS:
        raise ValueError(f"{key} must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    device = torch.device(device)
    if PRECISIONS[precision] is None:
        return
    if not torch.amp.is_autocast_available(device.type):
        raise ValueError(f"{key}={precision}: torch has no autocast for device {device}; use {key}=fp32")
    if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        name = torch.cuda.get_device_name(device)
        raise ValueError(f"{key}={precision}: {name} has no native bfloat16 (compute capability < 8.0); use {key}=fp32")


def autocast(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager:
    """What a forward pass runs under at ``precision``: autocast to its dtype, or nothing for fp32."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


@contextlib.contextmanager
def float32(*tensors: Tensor) -> Iterator[tuple[Tensor, ...]]:
    """Autocast off, and ``tensors`` raised to at least float32 (float64 stays float64, so the
    double-precision tests run as before)::

        with float32(x) as (x,):
            h = torch.sigmoid(F.linear(x, w.float(), b.float()))   # float32 even under bf16 autocast
    """
    device = next((t.device for t in tensors), torch.device("cpu"))
    with torch.autocast(device.type, enabled=False):
        yield tuple(t.to(torch.promote_types(t.dtype, torch.float32)) for t in tensors)


@dataclass(frozen=True)
class AutocastState:
    """The autocast state a forward pass ran under, replayed by a recomputation in backward."""

    device_type: str
    enabled: bool
    dtype: torch.dtype

    @classmethod
    def now(cls, device: torch.device | str) -> AutocastState:
        device_type = torch.device(device).type
        return cls(device_type, torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))

    def replay(self) -> torch.autocast:
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)
