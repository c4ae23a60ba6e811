"""experiments/llama_sink_reference.py: its schedule and the sink rows it reads from Llama's own attention
weights (ours are measured by the study ``streaming``: tests/studies/test_streaming_study.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.script_modules import load_script

SCRIPT = Path(__file__).parents[2] / "experiments" / "llama_sink_reference.py"


def test_the_llama_reference_schedule_and_its_sink_rows():
    """experiments/llama_sink_reference.py: warm-up then cosine as our trainer's schedule, and the mass read
    from Llama's own attention weights (where transformers is installed, make peers)."""
    reference = load_script(SCRIPT)
    rates = [reference.learning_rate(step, 100, 1e-3, 10) for step in range(100)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3) and rates[10] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(rates[10:], rates[11:])) and rates[-1] < 1e-5
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    llama = reference.build_llama(11, 32).eval()
    rows = reference.sink_rows(llama, torch.randint(0, 11, (2, 20)), first=10, sinks=2)
    assert len(rows) == 16 and all(0 <= r["mass"] <= 1 for r in rows)
