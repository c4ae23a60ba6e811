"""optim.schedule=one_cycle equals torch's OneCycleLR (the PyTorch LRA code's schedule) step by step, rate
and beta1 alike, also across a resume; optim.name=sgd is SGD with the momentum asked for."""

from __future__ import annotations

import pytest
import torch

from zoo.train.one_cycle import one_cycle_factor, one_cycle_momentum
from zoo.train.options import OptimOptions, make_optimizer, make_schedule


def _model():
    return torch.nn.Linear(3, 2)


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_one_cycle_follows_torch_one_cycle_lr(name):
    total, warmup = 40, 8  # pct_start 0.2, as LRA ListOps' 1,000 of 5,000
    ours_model, ref_model = _model(), _model()
    extra = {"momentum": 0.9} if name == "sgd" else {"betas": [0.9, 0.999]}
    ours = make_optimizer(ours_model, OptimOptions(name=name, lr=1e-3, schedule="one_cycle", warmup=warmup, **extra))
    sched = make_schedule(
        ours, OptimOptions(name=name, lr=1e-3, schedule="one_cycle", warmup=warmup, **extra), d_model=8, total=total
    )
    if name == "sgd":
        ref = torch.optim.SGD(ref_model.parameters(), lr=1e-3, momentum=0.9)
    else:
        ref = torch.optim.AdamW(ref_model.parameters(), lr=1e-3)
    ref_sched = torch.optim.lr_scheduler.OneCycleLR(
        ref, max_lr=1e-3, pct_start=warmup / total, anneal_strategy="linear", total_steps=total
    )
    key = "momentum" if name == "sgd" else "betas"
    for _ in range(total):
        got, want = ours.param_groups[0], ref.param_groups[0]
        assert got["lr"] == pytest.approx(want["lr"], rel=1e-12, abs=1e-18)
        assert got[key] == pytest.approx(want[key], rel=1e-12)
        ours.step(), ref.step()
        sched.step(), ref_sched.step()


def test_sgd_momentum_is_what_runs():
    options = OptimOptions(name="sgd", lr=3e-3, momentum=0.99, schedule="constant", warmup=0)
    opt = make_optimizer(_model(), options)
    assert isinstance(opt, torch.optim.SGD) and opt.param_groups[0]["momentum"] == 0.99
    assert "momentum 0.99" in options.describe()
    with pytest.raises(ValueError, match="SGD's"):
        OptimOptions(name="adam", momentum=0.9)
    with pytest.raises(ValueError, match="one_cycle needs"):
        make_schedule(opt, OptimOptions(name="sgd", schedule="one_cycle", warmup=0), d_model=8, total=10)


def test_cosine_floor_is_min_lr_ratio():
    opt = make_optimizer(_model(), OptimOptions(lr=1.0))
    sched = make_schedule(opt, OptimOptions(lr=1.0, schedule="cosine", warmup=0, min_lr_ratio=0.0), d_model=8, total=10)
    rates = []
    for _ in range(11):
        rates.append(opt.param_groups[0]["lr"])
        opt.step(), sched.step()
    # Transformer-XL's CosineAnnealingLR(max_step, eta_min=0): 0.5 (1 + cos(pi t / T))
    assert rates == pytest.approx([0.5 * (1 + torch.cos(torch.tensor(torch.pi * t / 10)).item()) for t in range(11)])


def test_one_cycle_holds_its_final_rate_past_the_last_step():
    """A scheduler stepped once more after the last optimiser step (the trainer logs that rate) must not
    carry the linear anneal below zero: a LRA ListOps run logged lr = -2.5e-8 at step 5,000 of 5,000."""
    final = one_cycle_factor(4999, 1000, 5000)
    assert final == pytest.approx(1 / 25 / 1e4)
    assert all(one_cycle_factor(step, 1000, 5000) == final for step in (5000, 5001, 10_000))
    assert one_cycle_momentum(5000, 1000, 5000) == one_cycle_momentum(4999, 1000, 5000) == pytest.approx(0.95)
