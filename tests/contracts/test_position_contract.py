"""The contract every registered position part keeps at the model's input (zoo/position/).

A part acting inside attention (rope, alibi, t5_bias) adds nothing here and passes these checks as the
identity; its own contract runs over every mechanism that accepts it in test_positions_in_attention.py.

A signal registered with ``@POSITION.register`` is exercised here the moment it registers (built
with its ``contract_options()``), called as ``pos(x, offset=0) -> [b, t, d]``:

- shape and dtype of x kept (float32, float64), finite, up to ``max_len`` positions;
- continuing at an offset equals the same positions of one longer call (decoding with a cache);
- rows are independent (the signal depends on the position, not on the batch);
- the gradient passes through to x;
- a signal that adds something adds it at the scale of the token embeddings it is added to.
"""

from __future__ import annotations

import pytest
import torch

from zoo.models.base import TokenEmbedding
from zoo.position.base import POSITION

D, MAX_LEN = 16, 40
NAMES = POSITION.list()


def build(name: str):
    cls = POSITION.get(name)
    return cls(D, MAX_LEN, **cls.contract_options())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", NAMES)
def test_shape_dtype_and_finite_up_to_max_len(name, dtype):
    pos = build(name).to(dtype)
    for t in (1, 7, MAX_LEN):
        x = torch.randn(2, t, D, dtype=dtype)
        y = pos(x)
        assert y.shape == x.shape and y.dtype == dtype and torch.isfinite(y).all()


@pytest.mark.parametrize("name", NAMES)
def test_offset_continues_the_same_positions(name):
    pos = build(name)
    x = torch.randn(2, 12, D)
    whole = pos(x)
    for start in (1, 5, 11):
        torch.testing.assert_close(pos(x[:, start:], offset=start), whole[:, start:])
    torch.testing.assert_close(pos(x[:, 3:4], offset=3), whole[:, 3:4])


@pytest.mark.parametrize("name", NAMES)
def test_rows_are_independent_and_the_gradient_reaches_x(name):
    pos = build(name)
    x = torch.randn(3, 9, D, requires_grad=True)
    y = pos(x)
    torch.testing.assert_close(y[1:2], pos(x[1:2]))
    (grad,) = torch.autograd.grad(y.square().sum(), x)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


@pytest.mark.parametrize("name", NAMES)
def test_the_signal_starts_at_the_scale_of_the_token_embeddings(name):
    """Learned positions once started at std 0.02 beside tokens at RMS 1 (TokenEmbedding scales by
    sqrt(d)): 2% of the input, so a 1-layer Reformer could not find a key by position and the
    duplication task stayed at chance where reformer-pytorch (both at std 1) passed 90% by step 75
    (results/reformer_table2)."""
    torch.manual_seed(0)
    d = 256  # wide enough for the RMS of one random table to sit near its std
    cls = POSITION.get(name)
    pos = cls(d, MAX_LEN, **cls.contract_options())
    signal = pos(torch.zeros(1, MAX_LEN, d))
    if not signal.abs().sum():
        pytest.skip(f"{name} adds nothing at the input")
    tokens = TokenEmbedding(512, d)(torch.arange(512)[None])
    ratio = signal.square().mean().sqrt() / tokens.square().mean().sqrt()
    assert 0.5 <= ratio <= 2.0, f"{name}: position RMS is {ratio:.3f} x the token RMS"
