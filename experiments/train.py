"""Train one configuration (or a sweep with -m); returns the validation metric for sweepers.

    python experiments/train.py experiment=tiny model=vanilla_lm data=associative_recall
    python experiments/train.py -m experiment=tiny model=vanilla_lm attention=vanilla,additive
    python experiments/train.py sweep=attention_seed experiment=tiny sweep.baseline=attention:vanilla
    python experiments/train.py sweep=attention_seed experiment=tiny hydra.sweep.dir=DIR sweep.resume=true
    python experiments/train.py imports=[my_research.attention] attention=my_attention   # your own part
    torchrun --nproc_per_node=2 experiments/train.py experiment=tiny      # data parallel

Model code lives in zoo/; the app's glue in zoo/app/ (a multirun's jobs: zoo/app/jobs.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from zoo.app.compose import launch
from zoo.app.jobs import run_job
from zoo.app.run import run


@hydra.main(version_base="1.3", config_path=str(Path(__file__).resolve().parents[1] / "conf"), config_name="config")
def train(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return run_job(cfg) if HydraConfig.get().mode == RunMode.MULTIRUN else run(cfg)


def main() -> None:
    """The command line (``sys.argv``): ``imports=`` first, then Hydra composes and runs ``train``."""
    launch(train, sys.argv[1:])


if __name__ == "__main__":
    main()
