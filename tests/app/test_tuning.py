"""Tuned comparisons (issue 28, item 3): an Optuna search whose trials and best trial reach the
sweep summary, and a comparison that gives every variant the same tuning budget before re-running
each one's best over fresh seeds. Neither existed before this change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")

from support.app_cli import TOY, read_csv, train_main  # noqa: E402

TEXT = ["trainer.max_steps=3", "data=char_lm"]


def job_config(row: dict) -> dict:
    return json.loads((Path(row["dir"]) / "config.json").read_text())["config"]


def test_an_optuna_search_runs_what_each_trial_asked_and_names_the_best(tmp_path, monkeypatch, text_file):
    """hparams_search=optuna, 3 trials on text (bpc: minimised, as the task says): every job trained
    with the learning rate, warm-up and dropout its trial asked (set == runs), and the summary lists
    the trials best first and names the lowest-bpc one."""
    sweep = tmp_path / "sweep"
    argv = ["hparams_search=optuna", *TOY, *TEXT, f"data.path={text_file}", "hydra.sweeper.n_trials=3"]
    assert train_main([*argv, f"hydra.sweep.dir={sweep}"], monkeypatch) == 0
    rows = read_csv(sweep / "summary.csv")
    assert len(rows) == 3 and len({r["optim.lr"] for r in rows}) == 3
    for row in rows:
        config = job_config(row)
        assert config["optim"]["lr"] == float(row["optim.lr"]) and config["optim"]["warmup"] == int(row["optim.warmup"])
        assert config["model"]["dropout"] == float(row["model.dropout"])
    best = min(rows, key=lambda r: float(r["final_metric"]))
    md = (sweep / "summary.md").read_text()
    assert "## Search `optuna`: 3 trials, best first" in md and "## Variants" not in md  # trials, not variants
    assert f"Best trial: model.dropout={best['model.dropout']}, optim.lr={best['optim.lr']}" in md.replace("\n", " ")
    optuna_best = (sweep / "optimization_results.yaml").read_text()
    assert f"best_value: {float(best['final_metric'])}" in optuna_best  # the sweeper agrees


def test_tuned_compare_gives_every_variant_the_same_search_then_compares_their_bests(tmp_path, monkeypatch, text_file):
    """Two mechanisms, 2 trials each on tuning seed 0, then each one's best re-run on seeds 1 and 2:
    both searches ran the same trials (the same sampler seed, the same space), each final job runs
    its own variant's best, and the summary aggregates the finals only, compared with vanilla."""
    sweep = tmp_path / "sweep"
    argv = ["sweep=tuned_compare", *TOY, *TEXT, f"data.path={text_file}", "hydra.sweeper.variants=[vanilla,additive]"]
    argv += ["hydra.sweeper.n_trials=2", "hydra.sweeper.seeds=[1,2]", f"hydra.sweep.dir={sweep}"]
    assert train_main(argv, monkeypatch) == 0
    tuning = json.loads((sweep / "tuning.json").read_text())["variants"]
    vanilla, additive = tuning["attention=vanilla"], tuning["attention=additive"]
    assert [t["params"] for t in vanilla["trials"]] == [t["params"] for t in additive["trials"]]  # one budget
    rows = read_csv(sweep / "summary.csv")
    assert len(rows) == 8
    finals = [r for r in rows if r["seed"] in ("1", "2")]
    assert all(r["sweep.search"] == "" for r in finals) and all(r["seed"] == "0" for r in rows if r["sweep.search"])
    for row in finals:
        best = tuning[f"attention={row['attention']}"]["best_params"]
        config = job_config(row)
        assert config["optim"]["lr"] == best["optim.lr"] and config["model"]["dropout"] == best["model.dropout"]
        trial_values = [v for t in tuning[f"attention={row['attention']}"]["trials"] for v in t["values"]]
        assert tuning[f"attention={row['attention']}"]["best_value"] == min(trial_values)  # bpc: lowest
    variants = {v["attention"]: v for v in read_csv(sweep / "summary_variants.csv")}
    assert sorted(variants) == ["additive", "vanilla"] and all(v["seeds"] == "1 2" for v in variants.values())
    assert variants["vanilla"]["verdict"] == "baseline" and variants["additive"]["paired"] == "True"
    md = (sweep / "summary.md").read_text()
    assert "## Search `attention:vanilla`: 2 trials" in md and "## Search `attention:additive`: 2 trials" in md


def test_tuned_compare_refuses_a_command_line_it_would_overrule(tmp_path, monkeypatch, capsys):
    """A seed (or the compared key, or a searched one) on the command line would be overruled for
    every job: refused before anything is written, naming what to use instead."""
    sweep = tmp_path / "sweep"
    argv = ["sweep=tuned_compare", *TOY, "seed=3", "optim.lr=0.01", f"hydra.sweep.dir={sweep}"]
    assert train_main(argv, monkeypatch) == 2
    error = capsys.readouterr().err
    assert "remove seed=3 optim.lr=0.01 from the command line" in error and "hydra.sweeper.seeds" in error
    assert not sweep.exists()
