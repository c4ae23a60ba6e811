"""From a training checkpoint to a shareable model folder (``experiments/export.py CKPT OUT``).

The checkpoint is read as data (``torch.load(weights_only=True)``, its checksum checked first), its
weights loaded into the model its stored config rebuilds, and the folder written by
:func:`zoo.hub.save_pretrained` with the run's record: data, steps, sequences per step, precision,
the latest evaluation and the best value of the run's metric. Nothing of the checkpoint's paths
(data files, run directories) goes into the folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from zoo.data.base import TASK
from zoo.hub.folder import write_folder
from zoo.presets.factory import create_model
from zoo.train.checkpoints.format import import_recorded, load_checkpoint


def training_record(ckpt: dict[str, Any]) -> dict[str, Any]:
    """What the model card says of the run that saved ``ckpt`` (a checkpoint's payload)."""
    cfg = ckpt.get("config") or {}
    trainer = cfg.get("trainer") or {}
    task = ckpt["task"]
    record: dict[str, Any] = {
        "data": task["name"],
        "seq_len": task["seq_len"],
        "sequences_per_step": task["batch_size"] * int(ckpt.get("world_size") or 1) * int(trainer.get("accumulate", 1)),
        "steps": ckpt["step"],
        "precision": trainer.get("precision", "fp32"),
    }
    if cfg.get("experiment"):
        record["experiment"] = cfg["experiment"]
    evaluation = ckpt.get("evaluation")  # checkpoints written before it was kept have the best value only
    if evaluation:
        record["evaluation"] = dict(evaluation)
    if ckpt.get("best") is not None:
        metric = evaluation["metric"] if evaluation else None
        if metric is None and task["name"] in TASK:
            metric = f"{trainer.get('eval_split', 'val')}/{TASK.get(task['name']).metric}"
        record["best"] = {"metric": metric or "metric", "value": ckpt["best"]}
    return record


def model_from_checkpoint(checkpoint: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """(the model with the checkpoint's weights, in eval mode; the checkpoint). The modules the run
    imported for its own parts (``imports=``) are imported again, as evaluate/sample do."""
    ckpt = load_checkpoint(checkpoint)
    import_recorded(ckpt.get("config") or {}, checkpoint)
    model = create_model(**ckpt["model_config"])
    model.load_state_dict(ckpt["model"])
    return model.eval(), ckpt


def export_checkpoint(checkpoint: str | Path, out: str | Path) -> Path:
    """Write the folder of ``checkpoint``'s model into ``out``, with its run's record."""
    model, ckpt = model_from_checkpoint(checkpoint)
    return write_folder(model, out, training_record(ckpt))
