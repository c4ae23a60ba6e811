"""Run a registered study (a reproduction) and write its report; or re-render the report from its rows.

    python experiments/study.py study=alibi_extrapolation                    # run, then report into results/<name>/
    python experiments/study.py study=alibi_extrapolation study.seeds=[0] study.steps=200 out=runs/try
    python experiments/study.py study=alibi_extrapolation report_only=true   # table, figure, verdict from rows.csv
    python experiments/study.py -m study=alibi_extrapolation study.seeds=[0],[1]   # a multirun, as for training

Studies live in zoo/studies/ (one file each); ``conf/study/`` is generated from them by sync_configs.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from zoo.app.compose import launch
from zoo.app.study import run_study


@hydra.main(version_base="1.3", config_path=str(Path(__file__).resolve().parents[1] / "conf"), config_name="study_app")
def study(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    run_study(cfg, list(HydraConfig.get().overrides.task))


def main() -> None:
    launch(study, sys.argv[1:])


if __name__ == "__main__":
    main()
