"""A training run's checkpoints, one concern a module: ``format.py`` what a checkpoint file holds and how it
is written and read as data (atomic saves, ``load_checkpoint``); ``checksums.py`` the SHA-256 sidecar and zip
CRC-32 checks a file passes before it is read; ``resume.py`` the policy of which checkpoint a run continues
and what of today's options applies; ``saving.py`` the trainer's side (when it saves, best and last, resuming
its progress)."""
