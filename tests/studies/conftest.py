"""Fixtures the study tests share."""

from __future__ import annotations

import pytest

import zoo.studies.reference_loop as reference_loop
from zoo.train.steps import train_step


@pytest.fixture
def stepped_losses(monkeypatch) -> list[float]:
    """The loss of every step the studies' shared loop takes from now on (its ``train_step`` recorded)."""
    seen: list[float] = []

    def recording(*args, **kwargs):
        out, loss = train_step(*args, **kwargs)
        seen.append(float(loss))
        return out, loss

    monkeypatch.setattr(reference_loop, "train_step", recording)
    return seen
