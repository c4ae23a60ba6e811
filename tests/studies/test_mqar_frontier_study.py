"""The MQAR frontier study without training: a point's family and setting come from its overrides, the front
keeps only the points no other point beats with no more state, and each family's line reads as it grows."""

from __future__ import annotations

from zoo.studies import StudyPaths, create_study
from zoo.studies.mqar_frontier import family, setting


def final(spec: str, state: int, accuracy: float, seed: int = 0) -> dict[str, str]:
    return dict(run=spec, mechanism=family(spec), seed=str(seed), kind="final", step="10", accuracy=str(accuracy),
                best_accuracy=str(accuracy), state_bytes_per_layer=str(state), no_state="", window_ceiling="",
                params="100", wall_s="1", load_1min="1.0")


def test_a_points_family_and_setting_come_from_its_overrides():
    assert family("attention=gla attention.expand_k=0.25") == "gla"
    assert setting("attention=gla attention.expand_k=0.25") == "expand_k=0.25"
    assert setting("attention=linear model.n_heads=4") == "n_heads=4"
    assert setting("attention=vanilla") == "default"


def test_the_front_drops_a_point_beaten_with_less_state_and_the_report_names_it(tmp_path):
    study = create_study("mqar_frontier", StudyPaths(out=tmp_path, runs=tmp_path))
    rows = [final("attention=vanilla", 32768, 1.0), final("attention=vanilla attention.n_kv_heads=1", 16384, 0.6),
            final("attention=gla", 4096, 0.26), final("attention=gla attention.expand_k=1.0", 8192, 0.25),
            final("attention=gated_deltanet", 19456, 1.0), final("attention=gated_deltanet", 19456, 1.0, seed=1)]
    report = study.report(rows)
    front = report.split("**The Pareto front**")[1].split("\n")[0]
    # gla at 8,192 B recalls less than gla at 4,096 B; vanilla's 32,768 B buys nothing over the delta rule's 19,456
    assert "`gla` default (4,096 B, 0.260)" in front and "expand_k=1.0" not in front
    assert "`gated_deltanet` default (19,456 B, 1.000)" in front and "32,768" not in front
    assert "`vanilla` n_kv_heads=1 (16,384 B, 0.600)" in front
    assert "`gated_deltanet`: 1.000 at 19,456 B; recalls (>= 0.9) from 19,456 B (default)" in report
    assert "`gla`: 0.260 at 4,096 B -> 0.250 at 8,192 B; stays on the plateau" in report
    assert "| `gated_deltanet` | default | 19,456 | 1.000 1.000 |" in report
    assert (tmp_path / "mqar_frontier.png").stat().st_size > 0
