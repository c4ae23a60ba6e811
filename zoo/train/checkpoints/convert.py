"""A sharded checkpoint (an FSDP run's ``.dcp`` directory, :mod:`zoo.train.checkpoints.sharded`) as the
single checkpoint file every other tool reads: ``python experiments/export.py last.dcp --single-file last.pt``."""

from __future__ import annotations

from pathlib import Path

from zoo.presets.factory import create_model
from zoo.train.checkpoints.format import import_recorded, save_checkpoint
from zoo.train.checkpoints.resume import with_new_model_defaults
from zoo.train.checkpoints.sharded import checked_directory, load_sharded, read_run_file
from zoo.train.options import OptimOptions, make_optimizer


def to_single_file(sharded: str | Path, out: str | Path) -> Path:
    """Write the sharded checkpoint ``sharded`` as one checkpoint file ``out`` (with its checksum sidecar),
    the one a run without FSDP writes: evaluate, sample, export and a resume without FSDP read it.
    Runs in one process; the model and optimiser are rebuilt from the checkpoint's own record."""
    sharded, out = Path(sharded), Path(out)
    checked_directory(sharded)
    record = read_run_file(sharded)
    import_recorded(record.get("config") or {}, sharded)
    model = create_model(**with_new_model_defaults(record["model_config"]))
    optimizer = make_optimizer(model, OptimOptions(**record["optim"])) if record.get("optim") else None
    load_sharded(sharded, model=model, optimizer=optimizer)
    payload = {**record, "model": model.state_dict()}
    if optimizer is not None:
        payload["optimizer"] = optimizer.state_dict()
    return save_checkpoint(out, payload)
