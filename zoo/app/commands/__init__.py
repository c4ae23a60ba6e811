"""The command lines of the entry points in ``experiments/`` that are not Hydra apps (evaluate, sample,
export, describe, demo, sync_configs): each parses its arguments and runs here, so ``experiments/<name>.py``
only calls :func:`command` (``train.py`` and ``study.py`` are Hydra apps: their arguments are overrides)."""
