"""The Al-Rfou auxiliary-loss study without training: each arm's overrides reach the model, the report reads
final bpc and the first step under each threshold per settings from the rows, and a finished run is not
trained again."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

import zoo.studies.al_rfou_aux as study_module
from zoo.app.compose import compose
from zoo.app.resolve import model_config
from zoo.studies import StudyPaths, create_study


def study(tmp_path, **options):
    return create_study("al_rfou_aux", StudyPaths(out=tmp_path, runs=tmp_path / "runs"),
                        **{**study_module.AlRfouAux.toy_options, **options})


def test_each_arm_sets_what_reaches_the_model(tmp_path):
    s = study(tmp_path)
    expected = {
        "aux": {"intermediate": True, "multi_target": 0.5, "layer_heads": True},
        "plain": {"intermediate": False, "multi_target": 0.0, "layer_heads": False},
        "aux_shared": {"intermediate": True, "multi_target": 0.5, "layer_heads": False},
    }
    for arm, aux_losses in expected.items():
        cfg = compose(s.overrides(arm, 0))
        assert dict(cfg.model.aux_losses) == aux_losses, arm
        # and what the built model gets after the preset's own dict is merged under it
        assert model_config(OmegaConf.to_container(cfg, resolve=True)).aux_losses == aux_losses, arm
        assert (cfg.model.n_layers, cfg.trainer.max_steps, cfg.seed) == (2, 2, 0)


def rows(key: str) -> list[dict[str, str]]:
    out = []
    for arm, curve, final in (("aux", [(2, 3.2), (4, 2.5)], 2.5), ("plain", [(2, 3.4), (4, 3.5)], 3.5)):
        tag = dict(settings=key, arm=arm, seed="0", max_steps="4")
        out += [dict(kind="eval", **tag, step=str(s), val_bpc=str(v), train_loss="") for s, v in curve]
        out.append(dict(kind="final", **tag, final_val_bpc=str(final), best_val_bpc=str(min(v for _, v in curve)),
                        steps="4", params="10", wall_s="1"))
    return out


def test_report_per_settings_with_threshold_steps_and_verdict(tmp_path, monkeypatch):
    s = study(tmp_path, thresholds=[3.0, 2.0])
    monkeypatch.setattr(s, "figure", lambda panels: None)  # drawn in the contract test
    report = s.report(rows("A") + rows("B")[:3])  # settings B: plain has no final row yet
    assert report.count("**Settings") == 2
    assert "| aux | 0 | 2.500 | 2.500 | 4 | not within 4 | 10 |" in report
    assert "| plain | 0 | 3.500 | 3.400 | not within 4 | not within 4 | 10 |" in report
    assert "| aux | 2.500 | 4 | - |" in report
    assert "the claim shows** at this budget: with the losses 2.500 against 3.500" in report
    assert "not enough rows" in report  # settings B


def test_finished_runs_are_not_trained_again(tmp_path, monkeypatch):
    s = study(tmp_path)
    s.rows_path.parent.mkdir(parents=True, exist_ok=True)
    study_module.Rows(s.rows_path, ()).add(rows(s.options.settings_key()))
    monkeypatch.setattr(study_module, "train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    s.run()
