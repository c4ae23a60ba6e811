"""The MQAR separation study without training: a window's ceiling is read from the task's generator (all
or nothing where the answer is known, growing with the window, two layers reaching further than one),
hybrids are named per layer, and the verdict tells a window's bound from a mechanism that failed to learn."""

from __future__ import annotations

import pytest

from zoo.studies import StudyPaths, create_study
from zoo.studies.mqar_separation import label, run_name, window_ceiling

CONFIG = dict(data=dict(num_kv_pairs=4, vocab_size=256, power_a=0.01, random_non_queries=True),
              trainer=dict(seq_len=64))


def model(attention, layers: int = 2) -> dict:
    return dict(name="vanilla_lm", vocab_size=256, d_model=16, n_heads=2, n_layers=layers, attention=attention)


def local(block: int, memory: int, layers: int = 2) -> dict:
    return model(dict(name="local_1d", block=block, memory=memory), layers)


def test_a_windows_ceiling_is_all_or_nothing_where_the_answer_is_known_and_grows_with_the_window():
    # queries start after the 8 tokens of the pairs: a block of 64 sees them all, blocks of 4 without memory none
    assert window_ceiling(CONFIG, local(64, 0), examples=64) == 1.0
    assert window_ceiling(CONFIG, local(4, 0), examples=64) == 0.0
    shares = [window_ceiling(CONFIG, local(4, m), examples=256) for m in (2, 4, 8, 16)]
    assert 0.0 < shares[0] < shares[1] < shares[2] < shares[3] < 1.0
    assert window_ceiling(CONFIG, local(4, 4, layers=1), examples=256) < shares[1]  # the second layer relays
    # a strided layer after a band reaches every earlier key: every query's key, whatever the gap
    assert window_ceiling(CONFIG, model(dict(name="sparse_strided", stride=8)), examples=64) == 1.0
    assert window_ceiling(CONFIG, model(dict(name="sparse_strided", stride=8), layers=1), examples=64) < 1.0
    assert window_ceiling(CONFIG, model(dict(name="vanilla"))) is None  # no fixed pattern: no ceiling
    hybrid = model([dict(name="local_1d", block=4, memory=4), "vanilla"])
    assert window_ceiling(CONFIG, hybrid) is None


def test_runs_and_hybrids_are_named_per_layer():
    assert run_name("attention=local_1d attention.block=4 attention.memory=4") == "local_1d_block_4_memory_4"
    hybrid = dict(n_layers=2, attention=[dict(name="local_1d", block=4, memory=4), "vanilla"])
    assert label(hybrid) == "local_1d(4+4)+vanilla"
    assert label(dict(n_layers=2, attention=dict(name="gla"))) == "gla"


def final(mechanism: str, seed: int, accuracy: float, ceiling: str = "") -> dict[str, str]:
    return dict(run=f"attention={mechanism}", mechanism=mechanism, seed=str(seed), kind="final", step="10",
                accuracy=str(accuracy), best_accuracy=str(accuracy), state_bytes_per_layer="1024", no_state="",
                window_ceiling=ceiling, params="100", wall_s="1", load_1min="1.0")


@pytest.mark.parametrize(
    "accuracies, ceiling, verdict",
    [
        ([0.99, 0.95], "", "`m` recalls (lowest seed 0.950)"),
        ([0.99, 0.3], "", "recalls on some seeds only"),
        ([0.3], "", "`m` does not recall at this budget"),
        ([0.36], "0.38", "a bound no training passes; it answers 0.360 (best seed), at that bound"),
        ([0.15], "0.38", "below it at this budget"),
        ([0.6], "0.38", "than its window reaches (0.380)"),
    ],
)
def test_the_verdict_reads_every_seed_and_a_windows_ceiling(accuracies, ceiling, verdict, tmp_path):
    study = create_study("mqar_separation", StudyPaths(out=tmp_path, runs=tmp_path))
    assert verdict in study.verdict("m", accuracies, ceiling)


def test_the_report_tables_each_mechanism_over_its_seeds(tmp_path):
    study = create_study("mqar_separation", StudyPaths(out=tmp_path, runs=tmp_path))
    rows = [final("vanilla", 0, 0.99), final("vanilla", 1, 0.97), final("local_1d(4+4)", 0, 0.36, "0.38")]
    rows.append(dict(rows[0], kind="eval", step="5", accuracy="0.5"))
    report = study.report(rows)
    assert "| `vanilla` | 0.990 0.970 | 0.980 [" in report
    assert "| `local_1d(4+4)` | 0.360 | 0.360 | 1,024 | 0.380 |" in report
    assert (tmp_path / "mqar_separation.png").stat().st_size > 0
