"""data.pack: documents laid out one per padded row or packed several to a row (zoo/data/packing.py).

The packed layout holds every document whole and scores exactly the targets the padded one scores, so a model
that keeps documents apart evaluates to the same loss on either (checked end to end on a small file)."""

from __future__ import annotations

import pytest
import torch

import zoo
from tests.data.test_data import _imdb_tarball
from zoo.config import IGNORE_INDEX
from zoo.data.base import create_task
from zoo.data.packing import lay_out, pack_order

LINES = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 12


def test_packing_keeps_documents_whole_and_fills_rows():
    lengths = [5, 9, 3, 12, 7, 2, 4]
    rows = pack_order(lengths, 12)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))  # each document once, whole
    assert all(sum(lengths[i] for i in row) <= 12 for row in rows)
    assert len(rows) == 4  # 42 tokens in rows of 12: first fit needs 4 (one per row would need 7)


def test_packed_rows_carry_documents_and_per_document_targets():
    docs = [torch.arange(1, n + 1) for n in (4, 3, 6)]
    targets = [d + 100 for d in docs]
    rows = lay_out(docs, 8, pack=True, targets=targets)
    assert rows.tokens.tolist() == [[1, 2, 3, 4, 1, 2, 3, 0], [1, 2, 3, 4, 5, 6, 0, 0]]
    assert rows.documents.tolist() == [[0, 0, 0, 0, 1, 1, 1, 2], [0, 0, 0, 0, 0, 0, 1, 1]]
    assert rows.targets[0, :7].tolist() == [101, 102, 103, 104, 101, 102, 103]  # the 4th's last target is its own
    assert (rows.targets[~rows.pad_mask] == IGNORE_INDEX).all()
    padded = lay_out(docs, 8, pack=False, targets=targets)
    assert len(padded) == 3 and padded.documents is None and padded.real_tokens == rows.real_tokens


def test_lines_lm_scores_the_same_targets_packed_or_padded(tmp_path):
    """Both layouts score every line's next bytes once; a vanilla LM gives the same summed loss on each."""
    path = tmp_path / "play.txt"
    path.write_text(LINES)
    options = {"batch_size": 4, "seq_len": 48, "path": str(path), "split": [0.5, 0.5, 0.0]}
    padded, packed = create_task("lines_lm", **options), create_task("lines_lm", **options, pack=True)
    assert len(packed.rows["val"]) < len(padded.rows["val"]) / 2
    assert int(packed.batch("train", 0)["documents"].max()) > 1  # a row holds several lines
    torch.manual_seed(0)
    model = zoo.create_model("vanilla_lm", vocab_size=257, d_model=32, n_heads=4, n_layers=1, max_len=48)
    model = model.double().eval()
    totals = []
    for task in (padded, packed):
        rows = task.rows["val"]
        with torch.no_grad():
            out = model(**rows.batch(torch.arange(len(rows))))
        totals.append((float(out.loss) * int(out.stats["scored"]), int(out.stats["scored"])))
    assert totals[0][1] == totals[1][1]
    assert totals[0][0] == pytest.approx(totals[1][0], rel=1e-5)


def test_imdb_packs_whole_reviews_with_one_class_each(tmp_path):
    path = _imdb_tarball(tmp_path)
    task = create_task("imdb", batch_size=2, seq_len=64, path=str(path), val_size=4, pack=True)
    batch = task.batch("train", 0)
    labels = iter(batch["targets"].tolist())
    for row, ids, real in zip(batch["tokens"], batch["documents"], batch["pad_mask"]):
        reviews = [task.decode(row[(ids == k) & real].tolist()) for k in ids[real].unique().tolist()]
        assert len(reviews) > 1  # short reviews: several to a row
        for review in reviews:
            assert review.startswith("pos" if next(labels) else "neg") and " review " in review
    assert next(labels, None) is None  # one class per review, row-major
    model = zoo.create_model("vanilla_classifier", vocab_size=257, n_classes=2, d_model=32, n_heads=4, n_layers=1)
    out = model(**batch)
    assert out.logits.shape == (batch["targets"].shape[0], 2) and out.loss.isfinite()
