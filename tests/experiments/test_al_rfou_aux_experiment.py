"""experiments/al_rfou_aux.py: the arms' command lines reach the model, the merge's table and threshold
step, resuming skips finished runs, and (slow) a smoke run of both arms through the app."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
from support.script_modules import load_script

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SHAKESPEARE = Path(os.environ.get("ZOO_DATA_DIR", PROJECT_ROOT.parent / "shared" / "data")) / "tinyshakespeare"


def script():
    return load_script(PROJECT_ROOT / "experiments" / "al_rfou_aux.py")


def write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def test_each_arm_sets_what_reaches_the_model(tmp_path):
    pytest.importorskip("hydra")
    from omegaconf import OmegaConf

    from zoo.app.compose import compose
    from zoo.app.resolve import model_config

    exp = script()
    args = exp.parse_args(["--smoke"])
    expected = {
        "aux": {"intermediate": True, "multi_target": 0.5, "layer_heads": True},
        "plain": {"intermediate": False, "multi_target": 0.0, "layer_heads": False},
        "aux_shared": {"intermediate": True, "multi_target": 0.5, "layer_heads": False},
    }
    for arm, aux_losses in expected.items():
        overrides = [o for o in exp.overrides(arm, 0, args, tmp_path) if not o.startswith(("hydra.", "data_dir="))]
        cfg = compose(overrides)
        assert dict(cfg.model.aux_losses) == aux_losses, arm
        # and what the built model gets after the preset's own dict is merged under it
        assert model_config(OmegaConf.to_container(cfg, resolve=True)).aux_losses == aux_losses, arm
        assert (cfg.model.n_layers, cfg.trainer.max_steps, cfg.optim.warmup) == (args.layers, args.steps, args.warmup)


def test_merge_reports_final_bpc_and_the_first_step_under_the_threshold(tmp_path):
    exp = script()
    args = exp.parse_args(["--smoke", "--thresholds", "3.0", "2.0", "--out", str(tmp_path)])
    key = exp.settings_key(args)
    write_csv(
        tmp_path / "runs.csv",
        exp.RUN_FIELDS,
        [
            dict(arm="aux", seed=0, settings=key, final_val_bpc=2.5, best_val_bpc=2.5, steps=4, params=10, wall_s=1),
            dict(arm="plain", seed=0, settings=key, final_val_bpc=3.5, best_val_bpc=3.4, steps=4, params=9, wall_s=1),
            dict(arm="plain", seed=1, settings="other", final_val_bpc=9, best_val_bpc=9, steps=4, params=9, wall_s=1),
        ],
    )
    curve = [("aux", 2, 3.2), ("aux", 4, 2.5), ("plain", 2, 3.4), ("plain", 4, 3.5)]
    rows = [dict(arm=a, seed=0, step=s, val_bpc=v, train_loss="") for a, s, v in curve]
    write_csv(tmp_path / "curves.csv", exp.CURVE_FIELDS, rows)
    table = exp.merge(args, tmp_path)
    assert "| aux | 0 | 2.500 | 2.500 | 4 | not within 4 | 10 |" in table
    assert "| plain | 0 | 3.500 | 3.400 | not within 4 | not within 4 | 9 |" in table
    assert "| aux | 2.500 | 4 | - |" in table
    assert "9.000" not in table  # a row of other settings is not mixed in
    assert (tmp_path / "curves.png").stat().st_size > 1000


def test_finished_runs_are_skipped(tmp_path, monkeypatch):
    exp = script()
    args = exp.parse_args(["--smoke", "--out", str(tmp_path)])
    rows = [
        dict(
            arm=arm,
            seed=0,
            settings=exp.settings_key(args),
            final_val_bpc=3,
            best_val_bpc=3,
            steps=4,
            params=1,
            wall_s=1,
        )
        for arm in ("aux", "plain")
    ]
    write_csv(tmp_path / "runs.csv", exp.RUN_FIELDS, rows)
    write_csv(tmp_path / "curves.csv", exp.CURVE_FIELDS, [])
    monkeypatch.setattr(exp, "run_one", lambda *a: pytest.fail("a finished run was started again"))
    assert exp.main(["--smoke", "--out", str(tmp_path)]) == 0


@pytest.mark.slow
def test_smoke_runs_both_arms_through_the_app(tmp_path):
    if not (SHAKESPEARE / "input.txt").is_file():
        pytest.skip(f"{SHAKESPEARE / 'input.txt'} absent (set ZOO_DATA_DIR)")
    exp = script()
    out = tmp_path / "out"
    argv = ["--smoke", "--out", str(out), "--runs-dir", str(tmp_path / "runs"), "--data-dir", str(SHAKESPEARE.parent)]
    assert exp.main(argv) == 0
    runs = list(csv.DictReader((out / "runs.csv").open()))
    assert {r["arm"] for r in runs} == {"aux", "plain"}
    assert int(runs[0]["params"]) > int(runs[1]["params"])  # the aux arm's own classifiers
    curves = list(csv.DictReader((out / "curves.csv").open()))
    assert {(c["arm"], c["step"]) for c in curves} == {(a, s) for a in ("aux", "plain") for s in ("2", "4")}
