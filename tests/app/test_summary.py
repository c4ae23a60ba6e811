"""The sweep summary: built from this multirun's jobs only, one column per key the sweep varied, and
each job of a sweep runs the value it was asked for."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

pytest.importorskip("hydra")

from support.app_cli import train_main  # noqa: E402

from zoo.app.summary import write_summary  # noqa: E402

TINY = [
    "experiment=tiny",
    "logger=csv",
    "trainer.max_steps=1",
    "trainer.eval_every=0",
    "trainer.eval_batches=1",
    "trainer.batch_size=2",
    "trainer.seq_len=16",
    "trainer.progress=false",
    "trainer.device=cpu",
    "trainer.checkpoints=false",
]


def train_multirun(argv: list[str], monkeypatch) -> None:
    """``python experiments/train.py -m ARGV`` in this process; every job must finish."""
    assert train_main(["-m", *argv], monkeypatch) == 0


def read_rows(sweep: Path, name: str = "summary.csv") -> list[dict[str, str]]:
    with open(sweep / name) as f:
        return list(csv.DictReader(f))


def job_table_header(md: str) -> str:
    """The header line of the summary's table of every job."""
    lines = md.splitlines()
    return lines[lines.index("## Every job (best first)") + 2]


def plant_job(job_dir: Path, overrides: list[str], result: dict, multirun_id: str | None = "an-earlier-sweep") -> None:
    """A job directory as a multirun leaves it: Hydra's overrides, the run's result (and the marker)."""
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if multirun_id:
        (job_dir / ".hydra" / "multirun_id").write_text(multirun_id + "\n")
    (job_dir / "result.json").write_text(
        json.dumps(
            {
                "status": "finished",
                "model": "vanilla_lm",
                "attention": "vanilla",
                "data": "duplication",
                "metric_name": "val/accuracy",
                "steps": 1,
                **result,
            }
        )
    )


def test_rerun_into_the_same_sweep_dir_summarises_this_multirun_only(tmp_path, monkeypatch):
    """An earlier 5-job sweep into the same directory, whose jobs 0-2 the user removed to run them
    again (jobs that still hold a run are refused: test_checkpoint), left jobs 3-4; this one runs 3
    jobs over residual=: the table holds those 3, one column says which residual each ran."""
    sweep = tmp_path / "sweep"
    for num in range(3, 5):
        plant_job(
            sweep / str(num),
            [f"attention={['vanilla', 'additive'][num % 2]}", f"seed={num}"],
            {"final_metric": 0.99, "seed": num},
        )
    train_multirun([*TINY, "residual=post_norm,pre_norm,rezero", f"hydra.sweep.dir={sweep}"], monkeypatch)
    rows = read_rows(sweep)
    assert sorted(r["residual"] for r in rows) == ["post_norm", "pre_norm", "rezero"], rows
    assert all(r["status"] == "finished" and float(r["final_metric"]) != 0.99 for r in rows)
    assert sorted(Path(r["dir"]).name for r in rows) == ["0", "1", "2"]
    for r in rows:  # each job ran the residual its column names
        config = json.loads((Path(r["dir"]) / "config.json").read_text())
        assert config["model_config"]["residual"]["name"] == r["residual"]
    md = (sweep / "summary.md").read_text()
    assert " residual |" in job_table_header(md) and "varied: `residual`" in md


def test_sweep_over_an_option_runs_each_value(tmp_path, monkeypatch):
    """attention.max_span=1024,8192 on adaptive_span_lm with experiment=tiny (whose own max_span is
    16): each job's model holds the value asked, and the summary has that column."""
    sweep = tmp_path / "sweep"
    train_multirun(
        [
            *TINY,
            "model=adaptive_span_lm",
            "attention=adaptive_span",
            "attention.max_span=1024,8192",
            f"hydra.sweep.dir={sweep}",
        ],
        monkeypatch,
    )
    rows = read_rows(sweep)
    assert sorted(r["attention.max_span"] for r in rows) == ["1024", "8192"]
    for r in rows:
        config = json.loads((Path(r["dir"]) / "config.json").read_text())
        assert config["model_config"]["attention"]["max_span"] == int(r["attention.max_span"])


def test_every_varied_key_is_a_column(tmp_path):
    """Residual, stack, position, part options, seed and any other override that differs between
    jobs each get a column; keys every job shares do not."""
    jobs = [
        (
            [
                "experiment=tiny",
                "residual=pre_norm",
                "stack=sequential",
                "attention.max_span=1024",
                "seed=0",
                "optim.lr=0.01",
            ],
            1.5,
        ),
        (
            [
                "experiment=tiny",
                "residual=rezero",
                "stack=reversible",
                "attention.max_span=8192",
                "seed=1",
                "optim.lr=0.01",
            ],
            1.2,
        ),
        (
            ["experiment=tiny", "residual=rezero", "stack=reversible", "position=learned", "seed=2", "optim.lr=0.01"],
            1.7,
        ),
    ]
    for num, (overrides, metric) in enumerate(jobs):
        plant_job(
            tmp_path / str(num),
            overrides,
            {"final_metric": metric, "seed": num, "metric_name": "val/bpc"},
            multirun_id=None,
        )
    paths = write_summary(tmp_path)
    rows = read_rows(tmp_path)
    assert [r["residual"] for r in rows] == ["rezero", "pre_norm", "rezero"]  # best (lowest bpc) first
    assert [r["stack"] for r in rows] == ["reversible", "sequential", "reversible"]
    assert [r["attention.max_span"] for r in rows] == ["8192", "1024", ""] and [r["position"] for r in rows] == [
        "",
        "",
        "learned",
    ]
    assert [r["seed"] for r in rows] == ["1", "0", "2"]
    assert "optim.lr" not in rows[0] and "experiment" not in rows[0]  # the same in every job
    header = job_table_header(paths["md"].read_text())
    assert (
        all(f" {k} " in header for k in ("residual", "stack", "attention.max_span", "position", "seed"))
        and "optim.lr" not in header
    )


def test_stale_jobs_alone_make_no_summary_and_delete_none(tmp_path):
    """A directory holding only another multirun's results: no summary of them, and the files there
    are left alone (before, the earlier sweep's summary was deleted)."""
    plant_job(tmp_path / "0", ["seed=0"], {"final_metric": 1.0})
    (tmp_path / "multirun_id").write_text("this-sweep\n")
    (tmp_path / "summary.csv").write_text("an earlier summary\n")
    assert write_summary(tmp_path) is None and (tmp_path / "summary.csv").read_text() == "an earlier summary\n"
    assert write_summary(tmp_path, multirun_id="an-earlier-sweep") is not None  # an explicit id picks that multirun


def test_summary_memory_and_throughput_are_the_benchmarks(tmp_path, text_file):
    """A sweep table and zoo.bench agree on what memory means: the summary's act_mib of a tiny run is
    the byte count zoo.bench reports for the same model, length and batch (one meter), under the
    same name and unit; tokens_per_s is forward + backward throughput as the bench measures it."""
    import torch

    from zoo import bench
    from zoo.app.compose import compose
    from zoo.app.run import run

    run_dir = tmp_path / "run"
    # a language model on text: every target scored, as in the bench's step (a task that leaves
    # targets unscored, like duplication, changes what the loss saves by a few bytes)
    run(
        compose(TINY + ["trainer.max_steps=3", "model.dropout=0.0", "data=char_lm", f"data.path={text_file}"]),
        run_dir=run_dir,
    )
    result = json.loads((run_dir / "result.json").read_text())
    write_summary(tmp_path)
    row = read_rows(tmp_path)[0]
    assert "peak_mem_mb" not in row and "activations_mb" not in result  # one name, bench's
    config = json.loads((run_dir / "config.json").read_text())["model_config"]
    variant = bench.Variant("same", "zoo", result["model"], config)
    shape = dict(
        d_model=config["d_model"],
        heads=config["n_heads"],
        layers=config["n_layers"],
        vocab=config["vocab_size"],
        batch=2,
        d_ff=config["d_ff"],
    )
    module, loss_fn = bench.build(variant, 16, shape, {})
    assert module.config.to_dict() == config
    expected = bench.activation_bytes(module, loss_fn, bench.bench_tokens(shape["vocab"], 2, 16)) / 2**20
    assert float(row["act_mib"]) == pytest.approx(expected, rel=1e-9) and expected > 0
    assert 0 < result["tokens_per_s"] and result["train_tokens_per_s"] <= result["tokens_per_s"]
    assert float(row["tokens_per_s"]) == pytest.approx(result["tokens_per_s"])
    assert torch.isfinite(torch.tensor(float(row["tokens_per_s"])))
