"""The LRA data check on a hand-written ListOps case in LRA's released layout: our reading equals the
reference dump (``]`` written as ``X``, val shuffled), and one changed token in the dump is found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoo.app.csv_rows import read_rows
from zoo.studies import StudyPaths, create_study

CASE = Path(__file__).parent / "data" / "listops_check"


def check(tmp_path: Path, reference: Path) -> str:
    study = create_study("lra_data_check", StudyPaths(out=tmp_path, runs=tmp_path), task="listops", data=str(CASE),
                         reference=str(reference), seq_len=8)
    study.run()
    return study.report(read_rows(study.rows_path))


def test_our_listops_reading_equals_the_reference_dump_and_a_changed_token_is_found(tmp_path):
    assert "every comparison agrees" in check(tmp_path / "same", CASE / "reference.json")
    dump = json.loads((CASE / "reference.json").read_text())
    dump["val"][0]["tokens"][1] = "4"
    (tmp_path / "changed.json").write_text(json.dumps(dump))
    report = check(tmp_path / "changed", tmp_path / "changed.json")
    assert "| listops | val | 8 | 2 | 16 token positions | 1 | 0 |" in report and "differences" in report


def test_reference_pickles_load_as_arrays_and_a_code_running_one_is_refused():
    import io
    import pickle

    import numpy as np

    from zoo.studies.lra_data_check import _ArrayUnpickler

    rows = [{"input_ids_0": np.arange(5, dtype=np.int32), "label": np.int64(1)}]
    got = _ArrayUnpickler(io.BytesIO(pickle.dumps(rows))).load()
    assert got[0]["input_ids_0"].tolist() == [0, 1, 2, 3, 4] and int(got[0]["label"]) == 1

    class RunsCode:
        def __reduce__(self):
            return (print, ("this ran",))

    with pytest.raises(pickle.UnpicklingError, match="builtins.print"):
        _ArrayUnpickler(io.BytesIO(pickle.dumps([RunsCode()]))).load()
