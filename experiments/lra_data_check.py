"""Our LRA data preparation, token for token, against what a reference pipeline made of the same files.

The reference side runs elsewhere (it needs TensorFlow, tensorflow-text and tensorflow-datasets, which the
project does not depend on) and dumps, per example, the token strings its encoder gives back and the label,
as JSON: ``{"val": [{"tokens": [...], "label": k}, ...], "test": [...]}``. This script reads the same files
through our task and compares every position of every example (commands and results:
results/lra_nystromformer/README.md):

    python experiments/lra_data_check.py listops --data DIR --reference DUMP.json --seq-len 2000
    python experiments/lra_data_check.py imdb --data aclImdb_v1.tar.gz --reference DUMP.json --seq-len 1000
    python experiments/lra_data_check.py aan --data TSV_DIR --reference DUMP.json --seq-len 4000
    python experiments/lra_data_check.py cifar10_gray --data cifar-10-batches-py --reference DUMP.npz --seq-len 1024
    python experiments/lra_data_check.py pathfinder --data RELEASED_DIR --reference PICKLE_DIR --seq-len 1024

Both sides are sorted by content before the comparison (LRA's pipeline shuffles even val and test).
``listops``: LRA's ``listops/input_pipeline.py`` writes ``]`` as ``X`` (its tokenizer drops non-alphanumeric
tokens) and pads with id 0; ours keeps ``]`` and pads with 0, so ``X`` is read as ``]``. ``imdb``: the
reference's ByteTextEncoder ids minus its one reserved id are byte values; that dump holds, per review, the
sha256 of the byte values it keeps (``[:max_length]``) joined by spaces, and the label, which are compared.
``aan``: LRA's ``matching/input_pipeline.py`` (tokenizer ``char``) on ``new_aan_pairs.{train,eval,test}.tsv``;
per pair the hash of both sides' byte values (``a b c | d e``) and the label.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from zoo.data import TASK


def listops_rows(data: str, seq_len: int, split: str) -> list[tuple[list[str], int]]:
    from zoo.data.listops import VOCAB

    task = TASK.get("listops")(path=data, seq_len=seq_len, batch_size=1, seed=0)
    tokens, labels = task.files[split]
    return [([VOCAB[i] if i else "<pad>" for i in row.tolist()], int(y)) for row, y in zip(tokens, labels)]


def imdb_rows(data: str, seq_len: int, split: str) -> list[tuple[list[str], int]]:
    task = TASK.get("imdb")(path=data, seq_len=seq_len, batch_size=1, seed=0)
    tokens, labels = task.splits[split]
    return [([str(i - 1) if i else "<pad>" for i in row.tolist()], int(y)) for row, y in zip(tokens, labels)]


def digest(tokens: list[str]) -> str:
    return hashlib.sha256(" ".join(tokens).encode()).hexdigest()


def aan_rows(data: str, seq_len: int, split: str) -> list[tuple[list[str], int]]:
    """One row per pair: both sides' byte values, joined by a '|' token (as the reference dump writes them)."""
    task = TASK.get("aan")(path=data, seq_len=seq_len, batch_size=1, seed=0)
    rows = []
    for index in range(len(task.splits[split][2])):
        batch = task.batch(split, index)
        sides = [[str(int(i) - 1) for i in side.tolist() if i] for side in batch["tokens"][0]]
        rows.append((sides[0] + ["|"] + sides[1], int(batch["targets"][0])))
    return rows


def image_check(task_name: str, data: str, reference: str) -> dict[str, int]:
    """cifar10_gray: our test pixels against the reference's (an npz of ``test_pixels`` [n, 1024] and
    ``test_labels``, in file order). pathfinder: every (pixels, label) we read from the released layout
    against the union of the Nystromformer pickles (``*.{train,dev,test}.pickle``: their script shuffles
    before its 80/10/10 cut, so the examples are compared as a multiset)."""
    import pickle

    import numpy as np

    if task_name == "cifar10_gray":
        task = TASK.get("cifar10_gray")(path=data, seq_len=1024, batch_size=1, seed=0, val_size=100)
        pixels, labels = (t.numpy().astype(np.int64) for t in task.splits["test"])
        ref = np.load(reference)
        return {
            "images": len(labels),
            "pixels_differing": int((pixels != ref["test_pixels"]).sum()),
            "labels_differing": int((labels != ref["test_labels"]).sum()),
        }
    task = TASK.get("pathfinder")(path=data, seq_len=1024, batch_size=1, seed=0)
    ours = sorted(
        (tuple(task._read(png).reshape(-1).tolist()), int(label)) for rows in task.rows.values() for png, label in rows
    )
    theirs = []
    for path in sorted(Path(reference).glob("*curv_contour_length_14.*.pickle")):
        with open(path, "rb") as f:
            theirs += [(tuple(int(v) for v in r["input_ids_0"]), int(r["label"])) for r in pickle.load(f)]
    theirs.sort()
    return {"images": len(ours), "images_differing": sum(a != b for a, b in zip(ours, theirs, strict=True))}


def compare(ours: list[tuple[list[str], int]], theirs: list[dict], rename: dict[str, str]) -> dict[str, int]:
    """Counts of examples, positions, differing positions and differing labels. Both sides are sorted by
    content first: LRA's ``make_csv_dataset`` shuffles even val and test (its ``shuffle`` defaults to on)."""
    if theirs and "sha256" in theirs[0]:  # a dump of hashes: compare the real tokens' hash per example
        mine_hashes = sorted((digest([t for t in tokens if t != "<pad>"]), label) for tokens, label in ours)
        ref_hashes = sorted((r["sha256"], r["label"]) for r in theirs)
        differing = sum(a != b for a, b in zip(mine_hashes, ref_hashes, strict=True))
        return {"examples": len(mine_hashes), "examples_differing": differing}
    width = max(len(t) for t, _ in ours)

    def padded(tokens: list[str]) -> list[str]:
        return tokens + ["<pad>"] * (width - len(tokens))

    mine = sorted((padded(tokens), label) for tokens, label in ours)
    ref = sorted((padded([rename.get(t, t) for t in r["tokens"]]), r["label"]) for r in theirs)
    token_diff = sum(sum(a != b for a, b in zip(x, y)) for (x, _), (y, _) in zip(mine, ref, strict=True))
    label_diff = sum(a != b for (_, a), (_, b) in zip(mine, ref, strict=True))
    return {
        "examples": len(mine),
        "positions": len(mine) * width,
        "tokens_differing": token_diff,
        "labels_differing": label_diff,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=["listops", "imdb", "aan", "cifar10_gray", "pathfinder"])
    parser.add_argument("--data", required=True)
    parser.add_argument("--reference", required=True, help="the reference pipeline's JSON dump")
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--splits", default="", help="comma-separated (default: the dump's splits)")
    parser.add_argument("--out", default="", help="write the counts as JSON here")
    args = parser.parse_args(argv)
    if args.task in ("cifar10_gray", "pathfinder"):
        report = {"test" if args.task == "cifar10_gray" else "all": image_check(args.task, args.data, args.reference)}
        print(report)
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
        return
    reference = json.loads(Path(args.reference).read_text())
    rows = {"listops": listops_rows, "imdb": imdb_rows, "aan": aan_rows}[args.task]
    rename = {"X": "]"} if args.task == "listops" else {}
    report = {}
    splits = args.splits.split(",") if args.splits else [k for k in ("val", "test") if k in reference]
    for split in splits:
        report[split] = compare(rows(args.data, args.seq_len, split), reference[split], rename)
        print(split, report[split])
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
