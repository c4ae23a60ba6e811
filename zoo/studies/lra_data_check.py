"""Our LRA data preparation, token for token, against what a reference pipeline made of the same files.

Paper: Tay et al. 2021, "Long Range Arena", arXiv:2011.04006 (the tasks' input pipelines in
google-research/long-range-arena) and Xiong et al. 2021, arXiv:2102.03902 (mlpen/Nystromformer's PyTorch
preparation). Question: does our task read each released file into the same tokens (pixels) and labels as
the reference pipeline does?

The reference side runs elsewhere (it needs TensorFlow, tensorflow-text and tensorflow-datasets, which the
project does not depend on) and dumps, per example, the token strings its encoder gives back and the label,
as JSON: ``{"val": [{"tokens": [...], "label": k}, ...], "test": [...]}``; ``cifar10_gray`` an npz of
``test_pixels`` [n, 1024] and ``test_labels``; ``pathfinder`` the Nystromformer pickles' directory. One run
checks one task (``task``, ``data``, ``reference``, ``seq_len``); its rows join the others' in ``rows.csv``.

Both sides are sorted by content before the comparison (LRA's pipeline shuffles even val and test).
``listops``: LRA's ``listops/input_pipeline.py`` writes ``]`` as ``X`` (its tokenizer drops non-alphanumeric
tokens) and pads with id 0; ours keeps ``]`` and pads with 0, so ``X`` is read as ``]``. ``imdb``: the
reference's ByteTextEncoder ids minus its one reserved id are byte values; that dump holds, per review, the
sha256 of the byte values it keeps (``[:max_length]``) joined by spaces, and the label, which are compared.
``aan``: LRA's ``matching/input_pipeline.py`` (tokenizer ``char``) on ``new_aan_pairs.{train,eval,test}.tsv``;
per pair the hash of both sides' byte values (``a b c | d e``) and the label.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path

from zoo.config import require
from zoo.data import TASK
from zoo.data.listops import VOCAB
from zoo.studies.base import STUDY, Study
from zoo.studies.common import PROJECT_ROOT, Rows

# what the Nystromformer pipeline's pickles hold: lists of dicts of numpy arrays and numbers
ARRAY_GLOBALS = {
    "numpy": {"ndarray", "dtype"},
    "numpy.core.multiarray": {"_reconstruct", "scalar"},
    "numpy._core.multiarray": {"_reconstruct", "scalar"},
}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays and plain containers only: a pickle naming any other global (which could run
    code) is refused rather than loaded."""

    def find_class(self, module: str, name: str):
        if name in ARRAY_GLOBALS.get(module, ()) or (module == "numpy" and name.endswith("DType")):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a numpy array's part: refused (data only)")

Example = tuple[list[str], int]
TASKS = ("listops", "imdb", "aan", "cifar10_gray", "pathfinder")


def listops_rows(data: str, seq_len: int, split: str) -> list[Example]:
    task = TASK.get("listops")(path=data, seq_len=seq_len, batch_size=1, seed=0)
    tokens, labels = task.files[split]
    return [([VOCAB[i] if i else "<pad>" for i in row.tolist()], int(y)) for row, y in zip(tokens, labels)]


def imdb_rows(data: str, seq_len: int, split: str) -> list[Example]:
    task = TASK.get("imdb")(path=data, seq_len=seq_len, batch_size=1, seed=0)
    tokens, labels = task.splits[split]
    return [([str(i - 1) if i else "<pad>" for i in row.tolist()], int(y)) for row, y in zip(tokens, labels)]


def aan_rows(data: str, seq_len: int, split: str) -> list[Example]:
    """One row per pair: both sides' byte values, joined by a '|' token (as the reference dump writes them)."""
    task = TASK.get("aan")(path=data, seq_len=seq_len, batch_size=1, seed=0)
    rows = []
    for index in range(len(task.splits[split][2])):
        batch = task.batch(split, index)
        sides = [[str(int(i) - 1) for i in side.tolist() if i] for side in batch["tokens"][0]]
        rows.append((sides[0] + ["|"] + sides[1], int(batch["targets"][0])))
    return rows


def digest(tokens: list[str]) -> str:
    return hashlib.sha256(" ".join(tokens).encode()).hexdigest()


def compare(ours: list[Example], theirs: list[dict], rename: dict[str, str]) -> dict[str, object]:
    """One row's counts: examples, what was compared (positions, or whole examples by hash), how many of those
    differ, and differing labels."""
    if theirs and "sha256" in theirs[0]:  # a dump of hashes: compare the real tokens' hash per example
        mine_hashes = sorted((digest([t for t in tokens if t != "<pad>"]), label) for tokens, label in ours)
        ref_hashes = sorted((r["sha256"], r["label"]) for r in theirs)
        differing = sum(a != b for a, b in zip(mine_hashes, ref_hashes, strict=True))
        return dict(examples=len(mine_hashes), unit="examples (sha256 with label)", compared=len(mine_hashes),
                    differing=differing, labels_differing="")
    width = max(len(t) for t, _ in ours)

    def padded(tokens: list[str]) -> list[str]:
        return tokens + ["<pad>"] * (width - len(tokens))

    mine = sorted((padded(tokens), label) for tokens, label in ours)
    ref = sorted((padded([rename.get(t, t) for t in r["tokens"]]), r["label"]) for r in theirs)
    return dict(examples=len(mine), unit="token positions", compared=len(mine) * width,
                differing=sum(sum(a != b for a, b in zip(x, y)) for (x, _), (y, _) in zip(mine, ref, strict=True)),
                labels_differing=sum(a != b for (_, a), (_, b) in zip(mine, ref, strict=True)))


def image_check(task_name: str, data: str, reference: str) -> dict[str, object]:
    """cifar10_gray: our test pixels against the reference's npz (in file order). pathfinder: every (pixels,
    label) read from the released layout against the union of the Nystromformer pickles
    (``*.{train,dev,test}.pickle``: their script shuffles before its 80/10/10 cut, so as a multiset)."""
    import numpy as np

    if task_name == "cifar10_gray":
        task = TASK.get("cifar10_gray")(path=data, seq_len=1024, batch_size=1, seed=0, val_size=100)
        pixels, labels = (t.numpy().astype(np.int64) for t in task.splits["test"])
        ref = np.load(reference)
        return dict(examples=len(labels), unit="pixels", compared=int(pixels.size),
                    differing=int((pixels != ref["test_pixels"]).sum()),
                    labels_differing=int((labels != ref["test_labels"]).sum()))
    task = TASK.get("pathfinder")(path=data, seq_len=1024, batch_size=1, seed=0)
    ours = sorted(
        (tuple(task._read(png).reshape(-1).tolist()), int(label)) for rows in task.rows.values() for png, label in rows
    )
    theirs = []
    for path in sorted(Path(reference).glob("*curv_contour_length_14.*.pickle")):
        with open(path, "rb") as f:
            theirs += [(tuple(int(v) for v in r["input_ids_0"]), int(r["label"])) for r in _ArrayUnpickler(f).load()]
    theirs.sort()
    return dict(examples=len(ours), unit="images (pixels with label)", compared=len(ours),
                differing=sum(a != b for a, b in zip(ours, theirs, strict=True)), labels_differing="")


@dataclass
class Options:
    task: str = "listops"
    data: str = ""  # the released files our task reads (a directory or the file, as distributed)
    reference: str = ""  # the reference pipeline's dump of the same files
    seq_len: int = 2000
    splits: list[str] = field(default_factory=list)  # empty: the dump's val and test

    def __post_init__(self) -> None:
        require(self.task in TASKS, f"study.task must be one of {', '.join(TASKS)}; got {self.task!r}")


@STUDY.register("lra_data_check")
class LraDataCheck(Study):
    Options = Options
    question = ("Does our LRA data preparation give the same tokens (pixels) and labels as the reference "
                "pipeline on the same files?")
    toy_options = dict(task="listops", data="tests/studies/data/listops_check",
                       reference="tests/studies/data/listops_check/reference.json", seq_len=8)

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("task", "split"))
        require(o.data and o.reference, "study.data and study.reference name the files to compare")
        data, reference = str(PROJECT_ROOT / o.data), str(PROJECT_ROOT / o.reference)
        if o.task in ("cifar10_gray", "pathfinder"):
            counts = {"test" if o.task == "cifar10_gray" else "all": image_check(o.task, data, reference)}
        else:
            dump = json.loads(Path(reference).read_text())
            read = {"listops": listops_rows, "imdb": imdb_rows, "aan": aan_rows}[o.task]
            rename = {"X": "]"} if o.task == "listops" else {}
            counts = {split: compare(read(data, o.seq_len, split), dump[split], rename)
                      for split in (o.splits or [k for k in ("val", "test") if k in dump])}
        rows.add({"task": o.task, "split": split, "seq_len": o.seq_len, **c} for split, c in counts.items()
                 if not rows.has(task=o.task, split=split))

    def report(self, rows: list[dict[str, str]]) -> str:
        lines = ["| task | split | length | examples | compared | differing | labels differing |",
                 "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['task']} | {r['split']} | {int(r['seq_len']):,} | {int(r['examples']):,} | "
                         f"{int(r['compared']):,} {r['unit']} | {r['differing']} | {r['labels_differing'] or '-'} |")
        differing = [f"{r['task']} {r['split']}" for r in rows
                     if int(r["differing"]) or (r["labels_differing"] and int(r["labels_differing"]))]
        tasks = sorted({r["task"] for r in rows})
        lines += ["", f"**Verdict: {'every comparison agrees' if not differing else 'differences'}** "
                  f"({', '.join(tasks)}): " + ("0 tokens, pixels or labels differ." if not differing else
                                             f"in {', '.join(differing)}.")]
        return "\n".join(lines)
