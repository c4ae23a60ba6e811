"""optim.name=adagrad: torch's Adagrad without clipping; with optim.parameter_clip the adaptive-span authors'
per-tensor clipping of the step (not of the accumulated squares); schedule=constant warms up as their
LambdaLR(min(1, step / warmup)); a resumed run takes the current clip."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from zoo.train.adagrad import ParameterClippedAdagrad
from zoo.train.options import OptimOptions, make_optimizer, make_schedule

REF = Path(os.environ.get("ZOO_REF_DIR", Path(__file__).resolve().parents[3] / "ref")) / "adaptive-span"


def _pair(seed: int = 0):
    torch.manual_seed(seed)
    first = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    second = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    second.load_state_dict(first.state_dict())
    return first, second


def _losses(model, optimizer, steps: int = 6, scale: float = 1.0):
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 4, generator=generator, dtype=torch.float64)
        optimizer.zero_grad()
        (scale * model(x).pow(2).sum()).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_without_clip_it_is_torch_adagrad():
    ours_model, ref_model = _pair()
    ours = make_optimizer(ours_model, OptimOptions(name="adagrad", lr=0.07, eps=1e-10))
    ref = torch.optim.Adagrad(ref_model.parameters(), lr=0.07, eps=1e-10)
    for got, want in zip(_losses(ours_model, ours), _losses(ref_model, ref)):
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-15)


def test_clip_scales_each_tensors_step_and_not_the_squared_sum():
    """The rule written out: s += g^2 (unclipped); w -= lr * f * g / (sqrt(s) + eps), f = c / (|g| + 1e-10)
    where the tensor's gradient norm |g| exceeds c, else 1."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    start = [p.detach().clone() for p in model.parameters()]
    lr, clip, eps = 0.07, 0.03, 1e-10
    optimizer = ParameterClippedAdagrad(model.parameters(), lr=lr, eps=eps, clip=clip)
    sums = [torch.zeros_like(p) for p in start]
    expected = [p.clone() for p in start]
    generator = torch.Generator().manual_seed(2)
    norms = []
    for _ in range(4):
        x = torch.randn(6, 3, generator=generator, dtype=torch.float64)
        optimizer.zero_grad()
        model(x).pow(2).sum().backward()
        for i, p in enumerate(model.parameters()):
            g = p.grad.detach()
            sums[i] += g * g
            n = g.norm().item()
            norms.append(n)
            rate = lr * (clip / (n + 1e-10) if n > clip else 1.0)
            expected[i] = expected[i] - rate * g / (sums[i].sqrt() + eps)
        optimizer.step()
        for got, want in zip(model.parameters(), expected):
            torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-14)
    assert max(norms) > clip  # the clip was exercised


def test_clip_leaves_small_gradients_and_other_tensors_alone():
    clipped_model, plain_model = _pair(3)
    clipped = ParameterClippedAdagrad(clipped_model.parameters(), lr=0.07, clip=1e6)
    plain = torch.optim.Adagrad(plain_model.parameters(), lr=0.07, eps=1e-10)
    for got, want in zip(_losses(clipped_model, clipped), _losses(plain_model, plain)):
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-15)


@pytest.mark.skipif(not REF.is_dir(), reason="facebookresearch/adaptive-span not fetched to ../ref/adaptive-span")
def test_equals_the_authors_adagrad_with_grad_clip():
    """Their AdagradWithGradClip, its value-first addcmul_ / addcdiv_ calls (deprecated overloads) passed on
    in today's form."""
    from zoo.bench.peers import import_checkout

    (module,) = import_checkout(REF, "adagrad_with_grad_clip")
    theirs_class = module.AdagradWithGradClip
    original = torch.Tensor.addcmul_, torch.Tensor.addcdiv_

    def addcmul_(self, *args, **kwargs):  # their addcmul_(1, g, g): the value-first overload, deprecated
        if args and isinstance(args[0], (int, float)):
            return original[0](self, args[1], args[2], value=args[0])
        return original[0](self, *args, **kwargs)

    def addcdiv_(self, *args, **kwargs):
        if args and not isinstance(args[0], torch.Tensor):
            return original[1](self, args[1], args[2], value=args[0])
        return original[1](self, *args, **kwargs)

    ours_model, their_model = _pair(4)
    ours = ParameterClippedAdagrad(ours_model.parameters(), lr=0.07, clip=0.03)
    theirs = theirs_class(their_model.parameters(), lr=0.07, grad_clip=0.03)
    torch.Tensor.addcmul_, torch.Tensor.addcdiv_ = addcmul_, addcdiv_
    try:
        want = _losses(their_model, theirs, scale=3.0)
    finally:
        torch.Tensor.addcmul_, torch.Tensor.addcdiv_ = original
    # their rate is lr / (1 + (step - 1) * lr_decay) with torch's float32 ``state["step"]``: lr 0.07 in float32
    # (0.07 + 3e-10), so their float64 weights move by a rate 4e-9 larger; hence 1e-8, not float64's 1e-12
    for got, expected in zip(_losses(ours_model, ours, scale=3.0), want):
        torch.testing.assert_close(got, expected, rtol=1e-8, atol=1e-12)


def test_constant_schedule_warms_up_as_the_authors_lambda():
    options = OptimOptions(name="adagrad", lr=0.07, parameter_clip=0.03, schedule="constant", warmup=4)
    optimizer = make_optimizer(torch.nn.Linear(2, 2), options)
    schedule = make_schedule(optimizer, options, d_model=8, total=100)
    rates = []
    for _ in range(7):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step(), schedule.step()
    # their scheduler.step() runs before optimizer.step(), so their update k (from 1) uses min(1, k / warmup)
    assert rates == pytest.approx([0.07 * min(1.0, k / 4) for k in range(1, 8)], rel=1e-12)
    no_warmup = OptimOptions(name="adagrad", lr=0.07, schedule="constant", warmup=0)
    optimizer = make_optimizer(torch.nn.Linear(2, 2), no_warmup)
    make_schedule(optimizer, no_warmup, d_model=8, total=10)
    assert optimizer.param_groups[0]["lr"] == 0.07


def test_parameter_clip_is_adagrads_and_described():
    with pytest.raises(ValueError, match="parameter_clip"):
        OptimOptions(name="adam", parameter_clip=0.03)
    with pytest.raises(ValueError, match="parameter_clip"):
        OptimOptions(name="adagrad", parameter_clip=-1.0)
    described = OptimOptions(name="adagrad", parameter_clip=0.03).describe()
    assert "Adagrad" in described and "0.03" in described
    assert math.isclose(make_optimizer(torch.nn.Linear(2, 2), OptimOptions(name="adagrad", lr=0.5)).defaults["lr"], 0.5)


def test_a_resumed_run_takes_the_current_clip():
    from zoo.train.checkpoints.resume import apply_optim_options

    saved_options = OptimOptions(name="adagrad", lr=0.07, parameter_clip=0.03, schedule="constant", warmup=0)
    model = torch.nn.Linear(2, 2)
    first = make_optimizer(model, saved_options)
    model(torch.ones(1, 2)).sum().backward()
    first.step()
    now = OptimOptions(name="adagrad", lr=0.07, parameter_clip=0.05, schedule="constant", warmup=0)
    second = make_optimizer(model, now)
    second.load_state_dict(first.state_dict())
    assert second.param_groups[0]["clip"] == 0.03  # what load_state_dict brings back
    apply_optim_options(second, make_schedule(second, now, d_model=8, total=10), now, {"parameter_clip": 0.03})
    assert second.param_groups[0]["clip"] == 0.05
