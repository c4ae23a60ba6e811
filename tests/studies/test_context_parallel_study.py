"""The context-parallel study without launching ranks: its tables and verdict come from the rows (bytes per
rank, the longest sequence within the budget, step times), and its options refuse what it cannot run."""

from __future__ import annotations

import pytest

from zoo.studies import StudyPaths, create_study

MIB = 2**20


def rows(longest_at_2: int) -> list[dict[str, str]]:
    out = []
    for ranks, per_rank in ((1, [100]), (2, [60, 40])):
        out += [dict(kind="bytes", setup="vanilla (ring)", ranks=str(ranks), rank=str(rank), bytes=str(mib * MIB),
                     length="8192", load_1min="1.5") for rank, mib in enumerate(per_rank)]
    for ranks, longest in ((1, 1024), (2, longest_at_2)):
        out.append(dict(kind="longest", setup="vanilla (ring)", ranks=str(ranks), longest=str(longest),
                        bytes_at_longest=str(120 * MIB), budget_mib="128.0", grain="512", load_1min="2.5"))
    for rnd, (one, two) in enumerate(((1.0, 2.0), (1.0, 4.0))):
        for ranks, seconds in ((1, one), (2, two)):
            out.append(dict(kind="step", setup="vanilla (ring)", ranks=str(ranks), threads="1", round=str(rnd),
                            step_s=str(seconds), length="4096", steps="2", load_1min="2.0"))
    return out


def test_tables_and_verdict_come_from_the_rows(tmp_path, monkeypatch):
    study = create_study("context_parallel", StudyPaths(out=tmp_path, runs=tmp_path), ranks=[1, 2])
    monkeypatch.setattr(study, "figure", lambda *args: None)  # drawn in the contract test; here the numbers
    report = study.report(rows(2048))
    assert "| vanilla (ring) | 100.0 / 100.0 MiB | 60.0 / 40.0 MiB | 1.67x |" in report
    assert "| vanilla (ring) | 1,024 (120.0 MiB) | 2,048 (120.0 MiB) |" in report
    assert "| vanilla (ring) | 1,000 ms (1.00x) | 3,000 ms (3.00x) |" in report  # medians over rounds
    assert "load average while measuring: 1.5-2.5" in report
    assert "the claim shows for vanilla (ring) 2.00x" in report
    assert "does not show for vanilla (ring) 1.50x" in study.report(rows(1536))


def test_options_refuse_what_cannot_run(tmp_path):
    with pytest.raises(ValueError, match="start at 1"):
        create_study("context_parallel", StudyPaths(out=tmp_path, runs=tmp_path), ranks=[2, 4])
    with pytest.raises(ValueError, match="mechanisms"):
        create_study("context_parallel", StudyPaths(out=tmp_path, runs=tmp_path), mechanisms=["lsh"])
