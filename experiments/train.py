"""Train one configuration (or a sweep with -m); returns the validation metric for sweepers.

    python experiments/train.py experiment=tiny model=vanilla_lm data=associative_recall
    python experiments/train.py -m experiment=tiny model=vanilla_lm attention=vanilla,additive
    python experiments/train.py sweep=all_lm experiment=tiny
    python experiments/train.py imports=[my_research.attention] attention=my_attention   # your own part
    torchrun --nproc_per_node=2 experiments/train.py experiment=tiny      # data parallel

Model code lives in zoo/; the app's glue in zoo/app/.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import hydra
from omegaconf import DictConfig

from zoo.app.compose import launch
from zoo.app.run import run


@hydra.main(version_base="1.3", config_path=str(Path(__file__).resolve().parents[1] / "conf"), config_name="config")
def train(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.get().mode != RunMode.MULTIRUN:
        return run(cfg)
    try:  # in a sweep one failing variant must not lose the others' summary
        return run(cfg)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001
        import json

        from zoo.train.rundir import RunDirError

        if isinstance(exc, RunDirError):  # the directory holds another run (or a link): write nothing into it
            print(f"run refused: {exc}", file=sys.stderr)
            return float("nan")
        out = Path(HydraConfig.get().runtime.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "error.txt").write_text(traceback.format_exc())
        (out / "result.json").write_text(
            json.dumps(
                {
                    "status": f"failed: {type(exc).__name__}: {exc}"[:300],
                    "model": cfg.model.preset,
                    "data": cfg.data.name,
                    "final_metric": float("nan"),
                }
            )
        )
        (out / "config.json").exists() or (out / "config.json").write_text(
            json.dumps({"run": f"{HydraConfig.get().job.num}:{HydraConfig.get().job.override_dirname}"})
        )
        print(f"run failed ({type(exc).__name__}: {exc}); see {out / 'error.txt'}", file=sys.stderr)
        return float("nan")


def main() -> None:
    """The command line (``sys.argv``): ``imports=`` first, then Hydra composes and runs ``train``."""
    launch(train, sys.argv[1:])


if __name__ == "__main__":
    main()
