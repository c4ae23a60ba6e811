"""The passkey study without training: a window's reach is read from the task's generator (all or nothing
where the key's place is fixed, shrinking with the length at a uniform place, two layers reaching further
than one), runs are named by mechanism and positions, and the verdict tells a refusal and a window's bound
from a failure to extrapolate."""

from __future__ import annotations

import pytest

from zoo.studies import StudyPaths, create_study
from zoo.studies.passkey import label, reach_share


def model(attention: dict, layers: int = 2) -> dict:
    return dict(name="vanilla_lm", vocab_size=16, d_model=16, n_heads=2, n_layers=layers, max_len=1024,
                attention=attention, position=dict(name="rope"))


def local(block: int, memory: int, layers: int = 2) -> dict:
    return model(dict(name="local_1d", block=block, memory=memory), layers)


def test_a_windows_reach_is_all_or_nothing_at_a_fixed_depth_and_shrinks_with_the_length():
    assert reach_share(local(64, 0), 64, -1.0, examples=64) == 1.0  # one block holds the whole sequence
    assert reach_share(local(16, 16), 1024, 1.0, examples=8) == 1.0  # the key just before the question
    assert reach_share(local(16, 16), 1024, 0.0, examples=8) == 0.0  # the key at the start, 1,000 tokens back
    shares = [reach_share(local(16, 16), n, -1.0, examples=256) for n in (64, 128, 256, 512)]
    assert 1.0 > shares[0] > shares[1] > shares[2] > shares[3] > 0.0
    assert reach_share(local(16, 16, layers=1), 128, -1.0, examples=256) < shares[1]  # the second layer relays
    assert reach_share(model(dict(name="sparse_strided", stride=8)), 128, -1.0, examples=64) == 1.0  # band, stride
    assert reach_share(model(dict(name="sparse_strided", stride=8), layers=1), 128, 0.0, examples=8) == 0.0
    assert reach_share(model(dict(name="vanilla")), 128, -1.0) is None  # every earlier key: no fixed bound


def test_runs_are_named_by_mechanism_and_positions():
    assert label(local(16, 16)) == "local_1d(16+16)+rope"
    learned = dict(max_len=64, attention=dict(name="vanilla"), position=dict(name="learned"))
    assert label(learned, "position=learned model.max_len=64") == "vanilla+learned(64)"
    strided = dict(attention=dict(name="sparse_strided", stride=8), position=dict(name="rope"))
    assert label(strided) == "sparse_strided(8)+rope"
    assert label(dict(attention=dict(name="vanilla"), position=dict(name="none"))) == "vanilla+none"
    assert label(dict(attention=dict(name="gated_deltanet"), position=dict(name="none"))) == "gated_deltanet"


LENGTHS = [64, 128, 256]


def cells(accuracy: dict[int, float], reach: dict[int, float] | None = None, refused: tuple[int, ...] = ()) -> dict:
    return {("m", n, "uniform"): (None if n in refused else accuracy[n], (reach or {}).get(n),
                                  "refuses" if n in refused else "") for n in LENGTHS}


@pytest.mark.parametrize(
    "measured, verdict",
    [
        (cells({64: 1.0, 128: 0.95, 256: 0.91}),
         "retrieves at every length tested (64-256), every depth (lowest 0.91)"),
        (cells({64: 0.5, 128: 0.2, 256: 0.1}),
         "does not solve the task at its training length 64 at this budget (1x: depth uniform 0.50)"),
        (cells({64: 1.0, 128: 1.0, 256: 0.1}, refused=(128, 256)),
         "cannot by construction past 64: the model refuses 128"),
        (cells({64: 1.0, 128: 0.95, 256: 0.3}), "fails from 256 (4x; depth uniform 0.30)."),
        (cells({64: 1.0, 128: 0.5, 256: 0.26}, reach={64: 1.0, 128: 0.5, 256: 0.25}),
         "cannot by construction where the key lies beyond its window (2 cells, each at the share of digits it can "
         "reach); where the window reaches every digit it retrieves (lowest 1.00)."),
        (cells({64: 0.7, 128: 0.3, 256: 0.2}, reach={64: 0.74, 128: 0.31, 256: 0.15}),
         "cannot by construction where the key lies beyond its window (3 cells"),  # not "does not solve" at 1x
        (cells({64: 1.0, 128: 0.3, 256: 0.26}, reach={64: 1.0, 128: 0.5, 256: 0.25}),
         "window (1 cells, each at the share of digits it can reach); where the window reaches every digit it "
         "retrieves (lowest 1.00); fails from 128 (2x; depth uniform 0.30)."),
    ],
)
def test_the_verdict_reads_refusals_windows_and_failures(measured, verdict, tmp_path):
    study = create_study("passkey", StudyPaths(out=tmp_path, runs=tmp_path), train_len=64)
    assert verdict in study.verdict("m", LENGTHS, ["uniform"], measured)
