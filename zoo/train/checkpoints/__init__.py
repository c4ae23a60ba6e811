"""A training run's checkpoints, one concern a module: ``format.py`` what a checkpoint file holds and how it
is written and read as data (checksums, atomic saves, ``load_checkpoint``); ``resume.py`` the policy of which
checkpoint a run continues and what of today's options applies; ``saving.py`` the trainer's side (when it
saves, best and last, resuming its progress)."""
