"""``hydra/sweeper=tuned_compare``: every variant tuned with the same budget, then its best
configuration re-run over seeds (the logic: :mod:`zoo.app.tuning`; the usual entry:
``sweep=tuned_compare``, whose file sets this sweeper and its search).

No ``from __future__ import annotations`` here: Hydra executes plugin modules outside
``sys.modules``, where dataclasses cannot resolve string annotations."""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf


@dataclass
class TunedCompareConf:
    _target_: str = "hydra_plugins.zoo_sweepers.tuned_compare.TunedCompareSweeper"
    compare: str = ""  # the key the variants differ in, e.g. attention
    variants: list[str] = field(default_factory=list)  # its values, e.g. [vanilla, local_1d, lsh]
    params: dict[str, str] = field(default_factory=dict)  # the search space, as hparams_search=optuna's
    n_trials: int = 8  # trials per variant
    tune_seeds: list[int] = field(default_factory=lambda: [0])  # each trial runs once per tuning seed
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])  # each variant's best, re-run over these
    direction: str = "minimize"  # maximize | minimize (sweep=tuned_compare asks the task)
    sampler_seed: int = 0  # every variant's TPE sampler starts from this seed
    startup_trials: int = 4  # random trials before TPE models the results


ConfigStore.instance().store(group="hydra/sweeper", name="tuned_compare", node=TunedCompareConf, provider="zoo")


class TunedCompareSweeper(Sweeper):
    def __init__(self, **options: Any) -> None:
        self.options = options

    @staticmethod
    def check_launch(config: DictConfig) -> None:
        """Refuse a launch this sweeper cannot run as asked (ValueError), before anything is written
        (called by the sweep summary's callback at the multirun's start)."""
        from zoo.app.tuning import check_launch

        options = OmegaConf.to_container(config.hydra.sweeper)
        arguments = list(config.hydra.overrides.task)
        check_launch(options["compare"], options["variants"], options["params"], arguments)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )

    def sweep(self, arguments: list[str]) -> Any:
        from zoo.app.tuning import check_launch, tuned_compare, variants_of

        options = {k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in self.options.items()}
        compare, values = options.pop("compare"), options.pop("variants")
        check_launch(compare, values, options["params"], arguments)  # done already when the summary callback runs
        variants = variants_of(compare, values)
        return tuned_compare(
            launcher=self.launcher,
            sweep_dir=self.config.hydra.sweep.dir,
            arguments=arguments,
            variants=variants,
            **options,
        )
