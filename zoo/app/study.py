"""From a composed study config to a finished study: ``experiments/study.py study=<name> ...``.

``conf/study_app.yaml`` is the root (``out``, ``runs``, ``threads``, ``report_only``, ``imports``); the
group ``conf/study/`` holds one generated file per registered study (its ``Options`` at their defaults).
The command written into the report is rebuilt from Hydra's record of the overrides, so the README block
a study writes names the command that made it.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from zoo.app.csv_rows import read_rows
from zoo.studies import StudyPaths, create_study
from zoo.studies.common import PROJECT_ROOT, report_block, write_report

NOT_PART_OF_THE_COMMAND = ("report_only=", "threads=")  # how it was run, not what it computes


def study_command(overrides: list[str]) -> str:
    kept = [o for o in overrides if not o.startswith(NOT_PART_OF_THE_COMMAND)]
    return " ".join(["python experiments/study.py", *kept])


def run_study(cfg: DictConfig, overrides: list[str]) -> dict[str, Any]:
    """Run (unless ``report_only``) then report the study ``cfg.study``; returns where it wrote."""
    import torch

    options = OmegaConf.to_container(cfg.study, resolve=True)
    name = options.pop("name")
    paths = StudyPaths(out=(PROJECT_ROOT / cfg.out).resolve(), runs=(PROJECT_ROOT / cfg.runs).resolve())
    study = create_study(name, paths, threads=cfg.threads, command=study_command(overrides), **options)
    torch.set_num_threads(cfg.threads)
    paths.out.mkdir(parents=True, exist_ok=True)
    if not cfg.report_only:
        study.run()
    rows = read_rows(study.rows_path)
    if not rows:
        raise SystemExit(f"study {name!r}: no rows in {study.rows_path} to report (run it without report_only=true)")
    body = study.report(rows)
    write_report(paths.out / "README.md", report_block(study.command, study.question, body), name)
    print(body)
    return {"out": str(paths.out), "rows": len(rows)}
