"""The adaptive-softmax cost study without timing: its verdict reads the speed-up and ours against torch's
time from the rows, and the targets follow a Zipf law (the head cluster takes most of them)."""

from __future__ import annotations

import torch

from zoo.studies import StudyPaths, create_study
from zoo.studies.adaptive_softmax import zipf_targets


def rows(ours_ms: float, full_ms: float = 1000.0, torch_ms: float = 100.0) -> list[dict[str, str]]:
    common = dict(tokens="256", d_model="410", vocab="267735", cutoffs="20000 40000 200000", threads="1",
                  rounds="5", target_share="0.8 0.1 0.09 0.01", load_1min="2.0", params="1000")
    return [dict(variant=v, ms_median=str(ms), speedup_vs_full=str(full_ms / ms), **common)
            for v, ms in (("full", full_ms), ("adaptive div_val=4", ours_ms), ("torch div_value=4", torch_ms))]


def test_verdict_needs_a_speed_up_and_torchs_speed(tmp_path):
    study = create_study("adaptive_softmax", StudyPaths(out=tmp_path, runs=tmp_path))
    assert "claim shows" in study.report(rows(110.0))
    assert "| adaptive div_val=4 | 110 | 9.1x | 0.0M |" in study.report(rows(110.0))
    assert "does not show" in study.report(rows(200.0))  # twice torch's time
    assert "does not show" in study.report(rows(1100.0, torch_ms=1000.0))  # no faster than the full softmax


def test_targets_follow_zipf():
    targets = zipf_targets(4000, 1000, torch.Generator().manual_seed(0))
    assert (targets < 100).float().mean() > 0.6 and targets.max() < 1000
