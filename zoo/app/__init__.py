"""The Hydra application's glue (``experiments/*.py`` are thin entry points over it).

Only this package imports Hydra/OmegaConf and wandb; ``import zoo`` never does.

- :mod:`zoo.app.schema`: structured-config schemas, generated from the registries (each attention's
  and task's ``Options`` dataclass, ``ModelConfig``), registered in Hydra's ConfigStore so a typo
  fails at compose time; part options default to null = unset (the preset's value);
- :mod:`zoo.app.compose`: the command line's launch (``imports=`` first, then Hydra composes, with
  no composition of ours ahead of it; an unknown key explained from Hydra's own failure) and
  composing outside ``@hydra.main``;
- :mod:`zoo.app.resolve`: the composed config -> the preset and the layers of overrides the user
  set (null = unset, read there only), resolved by :func:`zoo.config.resolve_model_config`;
- :mod:`zoo.app.run`: config -> task, model, loggers, :class:`zoo.train.trainer.Trainer`;
- :mod:`zoo.app.jobs`: one job of a multirun (run, resumed, kept or refused in its directory);
  :mod:`zoo.app.sweep_dir`: a sweep directory's record (what it sweeps, what became of each job);
- :mod:`zoo.app.summary`: the multirun callback writing ``summary.csv`` / ``summary.md`` / a plot,
  with :mod:`zoo.app.aggregate` (seeds into variants, intervals, verdicts against a baseline),
  :mod:`zoo.app.sweep_tables` and :mod:`zoo.app.sweep_plot`;
- :mod:`zoo.app.tuning`: ``sweep=tuned_compare``, every variant tuned with the same budget;
- :mod:`zoo.app.sync`: (re)writes ``conf/{attention,residual,stack,position}/*.yaml`` and
  ``conf/model/*.yaml`` from the registries.
"""
