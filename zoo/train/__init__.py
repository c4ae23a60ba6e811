"""Training: the step helpers (``steps.py``: ``adam``, ``train_step``, schedules), the Hydra app's
:class:`~zoo.train.trainer.Trainer`, its options, the checkpoint format and resume, the run directory,
evaluation metrics and protocols, loggers and data parallelism."""
