"""Turn a training checkpoint into a shareable model folder: model.safetensors + config.json + README.md
(the model card: preset, paper, parameters, the run's data and metric), loadable by zoo.from_pretrained.

    python experiments/export.py outputs/.../checkpoints/best.pt my-model/
    python experiments/export.py CKPT my-model/ --push-to-hub user/my-model [--private]   # needs a Hub token

The checkpoint is read as data (weights_only); the folder holds no path of the run. --push-to-hub
uploads the folder's three files (huggingface_hub; a token: HF_TOKEN or the huggingface_hub CLI login).

A sharded checkpoint of an FSDP run (trainer.fsdp=true: checkpoints/last.dcp/) exports the same way, or
becomes the single checkpoint file every other tool reads (evaluate, sample, a resume without FSDP):

    python experiments/export.py outputs/.../checkpoints/last.dcp --single-file last.pt
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from zoo.hub import push_folder
from zoo.hub.export import export_checkpoint
from zoo.hub.folder import CONFIG_FILE, NotAZooModel
from zoo.train.checkpoints.convert import to_single_file
from zoo.train.checkpoints.format import CheckpointError, checksum_path
from zoo.train.checkpoints.sharded import is_sharded


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a training checkpoint (checkpoints/best.pt or last.pt of a run)")
    parser.add_argument(
        "out", nargs="?", help="the model folder to write (created; a folder of another library is refused)"
    )
    parser.add_argument(
        "--single-file",
        default="",
        metavar="OUT.pt",
        help="instead: write a sharded checkpoint (an FSDP run's .dcp directory) as one checkpoint file",
    )
    parser.add_argument("--push-to-hub", default="", metavar="REPO_ID", help="then upload it to this Hub repository")
    parser.add_argument("--private", action="store_true", help="create the Hub repository private")
    args = parser.parse_args(argv)
    if args.single_file:
        if not is_sharded(args.checkpoint):
            parser.error(
                f"--single-file converts a sharded checkpoint (a .dcp directory); {args.checkpoint} is not one"
            )
        path = to_single_file(args.checkpoint, args.single_file)
        print(json.dumps({"checkpoint": str(path), "sha256": str(checksum_path(path))}, indent=2))
        return {"checkpoint": str(path)}
    if not args.out:
        parser.error("give the model folder to write (or --single-file OUT.pt for a sharded checkpoint)")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint  # a sharded one is exported through its single-file form
        if is_sharded(checkpoint):
            checkpoint = to_single_file(checkpoint, Path(tmp) / "checkpoint.pt")
        folder = export_checkpoint(checkpoint, args.out)
    info = json.loads((folder / CONFIG_FILE).read_text())
    training = info.get("training", {})
    summary = {
        "folder": str(folder),
        "preset": info["preset"],
        "params": info["params"],
        "data": training.get("data"),
        "steps": training.get("steps"),
        "evaluation": training.get("evaluation"),
    }
    if args.push_to_hub:
        summary["commit"] = push_folder(folder, args.push_to_hub, private=args.private or None)
    print(json.dumps(summary, indent=2))
    print(f"load it with: zoo.from_pretrained({str(args.push_to_hub or folder)!r})")
    return summary


def command() -> None:
    """``python experiments/export.py ARGS``: run with this process's arguments; exit 2 with the message on a
    refused input."""
    try:
        main()
    except (CheckpointError, NotAZooModel, ImportError) as exc:  # the message says what to do
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
