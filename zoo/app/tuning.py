"""A comparison after equal tuning (``sweep=tuned_compare``): every variant gets the same search,
then its best configuration is re-run over fresh seeds and compared as any seeded sweep is.

Comparing a tuned variant with an untuned one measures the tuning. Here each of the ``variants``
of the ``compare`` key (``attention``: ``[vanilla, local_1d, lsh]``) is searched alone with the same budget: the
same search space (``params``, in hydra-optuna-sweeper's syntax: ``tag(log, interval(1e-4, 1e-2))``,
``choice(0, 50)``), the same number of trials, the same tuning seed(s) and an Optuna TPE sampler
started from the same seed. A trial run over several tuning seeds scores their mean. Then each
variant's best trial is re-run over ``seeds`` (by default seeds the search never saw, so the
selection does not flatter it) and the summary aggregates those runs and gives the verdicts
(:mod:`zoo.app.aggregate`). Every job is a job of one multirun: one sweep directory, one summary, and
``sweep.resume=true`` replays the searches (kept jobs return their recorded metric, so the seeded
sampler asks the same trials again). The Hydra sweeper plugin is
``hydra_plugins/zoo_sweepers/tuned_compare.py``; ``tuning.json`` records each search.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zoo.app.sweep_dir import override_key
from zoo.train.rundir import write_text

OWNED = ("seed", "sweep.search")  # besides the compared key and the searched ones: set per job by the sweep


def variants_of(compare: str, values: list[Any]) -> list[str]:
    """``attention``, ``[vanilla, lsh]`` -> ``["attention=vanilla", "attention=lsh"]``."""
    if not compare or not values or "=" in compare:
        raise ValueError(
            f"hydra.sweeper.compare={compare!r}, hydra.sweeper.variants={values!r}: name the key and its values, "
            "e.g. hydra.sweeper.compare=attention 'hydra.sweeper.variants=[vanilla,local_1d,lsh]'"
        )
    return [f"{compare}={value}" for value in values]


def search_space(params: dict[str, str]) -> dict[str, Any]:
    """Optuna distributions from the search space, parsed as hparams_search=optuna's sweeper parses
    its ``params`` (the plugin's own parser, so both searches take one syntax)."""
    from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides

    distributions, fixed = create_params_from_overrides([f"{key}={value}" for key, value in params.items()])
    if fixed:
        raise ValueError(
            f"hydra.sweeper.params: {', '.join(fixed)} hold one value, not a search "
            "(interval(a, b), tag(log, interval(a, b)), choice(a, b), range(a, b)); set fixed values as overrides"
        )
    return distributions


def check_launch(compare: str, values: list[Any], params: dict[str, str], arguments: Sequence[str]) -> None:
    """Refuse (ValueError) a tuned comparison it cannot run as asked, before anything runs: no
    variants, a search space holding a fixed value, or a command line setting a key the sweep sets
    itself for every job (the command line would otherwise be silently overruled)."""
    variants_of(compare, values)
    search_space(params)
    owned = {compare, *params, *OWNED}
    clash = [a for a in arguments if override_key(a) in owned]
    if clash:
        raise ValueError(
            f"sweep=tuned_compare sets {', '.join(sorted(owned))} for each job itself; remove {' '.join(clash)} "
            "from the command line (variants: hydra.sweeper.variants, the search: hydra.sweeper.params, "
            "seeds: hydra.sweeper.tune_seeds and hydra.sweeper.seeds)"
        )


def launch_values(launcher: Any, batch: list[list[str]], first_job: int) -> list[float]:
    """Run ``batch`` as jobs ``first_job...``; their returned metrics (NaN for a job that did not finish)."""
    values = []
    for job in launcher.launch(batch, initial_job_idx=first_job):
        try:
            values.append(float(job.return_value))
        except Exception:  # noqa: BLE001 - a failed job: its exception is its return value
            values.append(math.nan)
    return values


def tuned_compare(
    *,
    launcher: Any,
    sweep_dir: str | Path,
    arguments: Sequence[str],
    variants: list[str],
    params: dict[str, str],
    n_trials: int,
    tune_seeds: list[int],
    seeds: list[int],
    direction: str,
    sampler_seed: int,
    startup_trials: int,
) -> dict[str, Any]:
    """Search each variant, then re-run each best over ``seeds``; returns (and writes) the record."""
    import optuna

    if n_trials < 1 or not tune_seeds or not seeds:
        raise ValueError("sweep=tuned_compare needs hydra.sweeper.n_trials >= 1, tune_seeds and seeds")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = search_space(params)
    sweep_dir, job = Path(sweep_dir), 0
    record: dict[str, Any] = dict(n_trials=n_trials, tune_seeds=tune_seeds, seeds=seeds, params=params, variants={})
    for variant in variants:
        sampler = optuna.samplers.TPESampler(seed=sampler_seed, n_startup_trials=startup_trials)
        study = optuna.create_study(direction=direction, sampler=sampler)
        search = variant.replace("=", ":", 1)  # the jobs' sweep.search: their trials' table in the summary
        trials = []
        for _ in range(n_trials):
            trial = study.ask(dict(distributions))
            tried = [f"{key}={value}" for key, value in trial.params.items()]
            batch = [[*arguments, variant, *tried, f"seed={seed}", f"sweep.search={search}"] for seed in tune_seeds]
            values = launch_values(launcher, batch, job)
            trials.append({"params": trial.params, "values": values, "jobs": list(range(job, job + len(batch)))})
            job += len(batch)
            if all(math.isfinite(v) for v in values):
                study.tell(trial, sum(values) / len(values))
            else:  # a failed trial tells the sampler nothing
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        best = study.best_trial if done else None
        record["variants"][variant] = {
            "trials": trials,
            "best_params": best.params if best else None,
            "best_value": best.value if best else None,
        }
        write_text(sweep_dir, sweep_dir / "tuning.json", json.dumps(record, indent=2))
    final = [
        [*arguments, variant, *(f"{key}={value}" for key, value in entry["best_params"].items()), f"seed={seed}"]
        for variant, entry in record["variants"].items()
        if entry["best_params"] is not None  # a variant none of whose trials finished is not compared
        for seed in seeds
    ]
    if final:
        launch_values(launcher, final, job)
    return record
