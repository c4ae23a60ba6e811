"""zoo.app.csv_rows: the append-as-you-go CSV protocol of the experiment scripts (a killed sweep keeps its rows)."""

from zoo.app.csv_rows import append_rows, read_rows


def test_missing_file_reads_as_no_rows(tmp_path):
    assert read_rows(tmp_path / "absent.csv") == []


def test_rows_append_under_one_header_and_read_back_as_strings(tmp_path):
    path = tmp_path / "deep" / "runs.csv"  # the folder is created
    append_rows(path, [{"run": "a", "bpc": 1.5}])
    append_rows(path, [{"run": "b", "bpc": 2}, {"run": "c", "bpc": 0.25}])
    assert read_rows(path) == [{"run": "a", "bpc": "1.5"}, {"run": "b", "bpc": "2"}, {"run": "c", "bpc": "0.25"}]
    assert path.read_text().count("run,bpc") == 1


def test_given_fields_set_the_column_order_and_missing_cells_stay_empty(tmp_path):
    path = tmp_path / "runs.csv"
    append_rows(path, [{"bpc": 1.0, "run": "a"}], fields=["run", "bpc", "note"])
    assert path.read_text().splitlines() == ["run,bpc,note", "a,1.0,"]


def test_a_new_key_grows_the_header_and_keeps_earlier_rows(tmp_path):
    path = tmp_path / "runs.csv"
    append_rows(path, [{"run": "a", "bpc": 1}])
    append_rows(path, [{"run": "b", "bpc": 2, "seed": 7}])
    assert read_rows(path) == [{"run": "a", "bpc": "1", "seed": ""}, {"run": "b", "bpc": "2", "seed": "7"}]


def test_nothing_to_append_writes_nothing(tmp_path):
    append_rows(tmp_path / "runs.csv", [])
    assert not (tmp_path / "runs.csv").exists()
