"""The decoding study lists a cell of more tokens than study.max_batch_tokens as skipped, with the reason,
instead of holding every variant's state for it (batch 8 x 64K was killed for memory on a 23 GiB machine)."""

from __future__ import annotations

from zoo.studies import StudyPaths, create_study
from zoo.studies.common import Rows
from zoo.studies.generate import Generate


def test_a_cell_over_the_token_limit_is_listed_skipped_and_the_others_measured(tmp_path):
    options = {**Generate.toy_options, "attention": ["local_1d"], "max_batch_tokens": 32}
    study = create_study("generate", StudyPaths(out=tmp_path, runs=tmp_path), **options)
    study.run()
    rows = Rows(study.rows_path, ("batch", "context", "variant")).read()
    status = {(r["batch"], r["context"]): r["status"] for r in rows}
    assert status[("2", "32")].startswith("skipped (batch x context > study.max_batch_tokens = 32")
    assert [status[cell] for cell in (("1", "16"), ("1", "32"), ("2", "16"))] == ["ok"] * 3
    assert "| local_1d | 2 | 32 |" in study.report(rows)
