"""Long Range Arena tasks and image data, from tiny files written in their published layouts:
AAN TSV pairs + the two-tower classifier, CIFAR-10 pickle batches (LRA grayscale and pixel LM),
downsampled ImageNet npz, Pathfinder (generator properties and the released layout), and the
refusals of bad input (missing batch file, npz without 'data', TSV row with wrong field count,
a 2D block shape the image cannot take)."""

from __future__ import annotations

import json
import math
import pickle
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch
from support.script_modules import load_script

import zoo
from zoo.data import DataFileNotFound, create_task
from zoo.data.images import CIFAR_TEST, CIFAR_TRAIN, synthetic_cifar10
from zoo.data.layouts import write_aan, write_imagenet, write_pathfinder_release
from zoo.data.pathfinder import JUMP, PathfinderStyle, generate_batch


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory):
    return synthetic_cifar10(tmp_path_factory.mktemp("cifar-10-batches-py"), per_batch=12)


# -- Retrieval --------------------------------------------------------------------------------------


def test_aan_pairs_as_bytes(tmp_path):
    task = create_task("aan", batch_size=4, seq_len=32, path=str(write_aan(tmp_path / "aan")))
    batch = task.batch("train", 0)
    assert (
        batch["tokens"].shape == (4, 2, 32) and batch["pad_mask"].shape == (4, 2, 32) and batch["targets"].shape == (4,)
    )
    assert torch.equal(batch["tokens"] != 0, batch["pad_mask"])  # byte + 1: only padding is 0
    val = task.batch("val", 0)
    first = (tmp_path / "aan" / "new_aan_pairs.eval.tsv").read_text().splitlines()[0].split("\t")
    assert (
        task.decode(val["tokens"][0, 0].tolist()) == first[3][:32]
        and task.decode(val["tokens"][0, 1].tolist()) == first[4][:32]
    )
    assert int(val["targets"][0]) == int(float(first[0]))


def test_aan_bad_rows_and_missing_files_are_named(tmp_path):
    directory = write_aan(tmp_path / "aan")
    path = directory / "new_aan_pairs.eval.tsv"
    lines = path.read_text().splitlines()
    lines[2] = "1\tonly\tthree"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"new_aan_pairs\.eval\.tsv:3: expected 5 tab-separated fields .* got 3"):
        create_task("aan", batch_size=2, seq_len=16, path=str(directory))
    (directory / "new_aan_pairs.test.tsv").unlink()
    with pytest.raises(DataFileNotFound, match="new_aan_pairs.test.tsv"):
        create_task("aan", batch_size=2, seq_len=16, path=str(directory))


def test_two_tower_shares_one_encoder_and_combines_u_v():
    """Logits = MLP([u, v, u*v, u-v]) with u, v from the same encoder; padding never leaks."""
    torch.manual_seed(0)
    model = zoo.create_model(
        "two_tower_classifier", vocab_size=20, d_model=16, n_layers=1, n_heads=2, d_ff=32, dropout=0.0
    ).eval()
    tokens = torch.randint(1, 20, (3, 2, 10))
    pad_mask = torch.ones(3, 2, 10, dtype=torch.bool)
    pad_mask[:, 1, 6:] = False
    out = model(tokens, pad_mask=pad_mask).logits
    u = model.encode(tokens[:, 0], pad_mask[:, 0])[0].mean(1)
    hidden_v = model.encode(tokens[:, 1], pad_mask[:, 1])[0]
    v = (hidden_v * pad_mask[:, 1, :, None]).sum(1) / pad_mask[:, 1].sum(1, keepdim=True)
    torch.testing.assert_close(out, model.head(torch.cat([u, v, u * v, u - v], -1)))
    embedded = model.embed(tokens.flatten(0, 1)).unflatten(0, (3, 2))  # the backbone path: vectors in
    torch.testing.assert_close(model(embeds=embedded, pad_mask=pad_mask).logits, out)
    backbone = zoo.create_model(
        "two_tower_classifier", vocab_size=20, d_model=16, n_layers=1, n_heads=2, d_ff=32, head="none"
    )
    assert backbone.head is None and backbone(tokens, pad_mask=pad_mask).hidden.shape == (3, 2, 10, 16)
    changed = tokens.clone()
    changed[:, 1, 6:] = 7  # padded positions of the second document
    torch.testing.assert_close(model(changed, pad_mask=pad_mask).logits, out)
    swapped = model(tokens.flip(1), pad_mask=pad_mask.flip(1)).logits
    assert not torch.allclose(swapped, out), "the order of the pair matters (u - v), as in LRA"
    with pytest.raises(ValueError, match=r"tokens \[b, 2, t\]"):
        model(tokens[:, 0])


# -- images -----------------------------------------------------------------------------------------


def test_cifar_pixels_interleaved_and_grayscale(cifar_dir):
    with open(cifar_dir / CIFAR_TEST, "rb") as f:
        raw = pickle.load(f, encoding="bytes")
    planes = raw[b"data"].reshape(-1, 3, 32, 32).astype(np.int64)
    lm = create_task("cifar10", batch_size=2, seq_len=3072, path=str(cifar_dir), val_size=4)
    batch = lm.batch("test", 0)
    assert batch["tokens"][0, 0] == 256 and torch.equal(batch["tokens"][:, 1:], batch["targets"][:, :-1])
    row, col = 5, 7  # pixel (5, 7): dims 3 * (5 * 32 + 7) + c
    dim = 3 * (row * 32 + col)
    assert batch["targets"][0, dim : dim + 3].tolist() == planes[0, :, row, col].tolist()
    gray = create_task("cifar10_gray", batch_size=2, seq_len=1024, path=str(cifar_dir), val_size=4).batch("test", 0)
    # TensorFlow's rgb_to_grayscale on uint8 (LRA's pipeline): x / 255 in float32, luma, x 255.5, truncated
    rgb = planes[0].astype(np.float32) * np.float32(1 / 255)
    w = [np.float32(v) for v in (0.2989, 0.5870, 0.1140)]
    luma = (rgb[0] * w[0] + rgb[1] * w[1] + rgb[2] * w[2]) * np.float32(255.5)
    assert gray["tokens"][0].tolist() == luma.astype(np.uint8).reshape(-1).tolist()
    assert gray["targets"][0] == raw[b"labels"][0]


def test_cifar_bad_input(cifar_dir, tmp_path):
    broken = tmp_path / "cifar"
    broken.mkdir()
    for name in CIFAR_TRAIN[:-1] + (CIFAR_TEST,):
        (broken / name).write_bytes((cifar_dir / name).read_bytes())
    with pytest.raises(DataFileNotFound, match="data_batch_5"):
        create_task("cifar10_gray", batch_size=2, seq_len=1024, path=str(broken))
    with open(broken / CIFAR_TRAIN[-1], "wb") as f:
        pickle.dump({b"labels": [0]}, f)
    with pytest.raises(ValueError, match=r"data_batch_5 has no b'data' key"):
        create_task("cifar10_gray", batch_size=2, seq_len=1024, path=str(broken))
    with open(broken / CIFAR_TRAIN[-1], "wb") as f:
        pickle.dump({b"data": Path("x"), b"labels": [0]}, f)  # any class beyond arrays is refused
    with pytest.raises(ValueError, match="refusing to load"):
        create_task("cifar10_gray", batch_size=2, seq_len=1024, path=str(broken))
    with pytest.raises(ValueError, match="trainer.seq_len=3072"):
        create_task("cifar10", batch_size=2, seq_len=1024, path=str(cifar_dir))


def test_imagenet_npz_layout_and_missing_key(tmp_path):
    directory = write_imagenet(tmp_path / "imagenet8")
    task = create_task("imagenet64", batch_size=4, seq_len=192, path=str(directory), image_size=8)
    batch = task.batch("train", 3)
    assert batch["tokens"].shape == (4, 192) and batch["targets"].max() < 256 and (batch["tokens"][:, 0] == 256).all()
    with np.load(directory / "val_data.npz") as f:
        first = f["data"][0].reshape(3, 64)
    assert task.batch("val", 0)["targets"][0, :6].tolist() == [
        first[0, 0],
        first[1, 0],
        first[2, 0],
        first[0, 1],
        first[1, 1],
        first[2, 1],
    ]
    np.savez(directory / "train_data_batch_2.npz", pixels=np.zeros((2, 192), dtype=np.uint8), labels=np.ones(2))
    with pytest.raises(ValueError, match=r"train_data_batch_2\.npz has no 'data' array"):
        create_task("imagenet64", batch_size=2, seq_len=192, path=str(directory), image_size=8)
    with pytest.raises(ValueError, match=r"needs \[n, 768\]"):
        write_imagenet(tmp_path / "again")
        create_task("imagenet64", batch_size=2, seq_len=768, path=str(tmp_path / "again"), image_size=16)


def test_2d_block_shape_the_image_cannot_take_is_refused(cifar_dir):
    from zoo.presets import build_model_for_task

    task = create_task("cifar10", batch_size=2, seq_len=3072, path=str(cifar_dir), val_size=4)
    with pytest.raises(ValueError, match="local_2d has width=32 .* raster 96 wide .* attention.width=96"):
        build_model_for_task(
            "image_transformer",
            task,
            **zoo.presets.factory.TINY | {"vocab_size": 257},
            attention={"name": "local_2d", "width": 32},
        )
    model = build_model_for_task("image_transformer", task, d_model=16, n_layers=1, n_heads=2, d_ff=16)
    assert model.config.attention["width"] == 96


# -- Pathfinder -------------------------------------------------------------------------------------


def joined(image: np.ndarray, a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Flood fill over lit pixels with steps of Chebyshev distance <= JUMP (a dash gap)."""
    lit = image > 0
    size = image.shape[0]
    seen = np.zeros_like(lit)
    queue = deque([a])
    seen[a] = True
    while queue:
        y, x = queue.popleft()
        if (y, x) == b:
            return True
        for dy in range(-JUMP, JUMP + 1):
            for dx in range(-JUMP, JUMP + 1):
                ny, nx = y + dy, x + dx
                if 0 <= ny < size and 0 <= nx < size and lit[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
    return False


def markers(image: np.ndarray) -> list[tuple[int, int]]:
    """Centres of the endpoint dots: lit pixels whose 3 x 3 neighbourhood is all lit."""
    lit = np.pad(image > 0, 1)
    full = np.ones_like(image, dtype=bool)
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            full &= lit[dy : dy + image.shape[0], dx : dx + image.shape[1]]
    centres = []
    for y, x in zip(*np.nonzero(full)):
        if all(max(abs(y - cy), abs(x - cx)) > 2 for cy, cx in centres):
            centres.append((int(y), int(x)))
    return centres


def test_pathfinder_generator_labels_mean_connected_by_pixels():
    images, labels = generate_batch(0, "train", 0, 24, PathfinderStyle.for_size(32))
    assert labels.sum() == 12, "labels balanced"
    for image, label in zip(images, labels):
        dots = markers(image)
        assert len(dots) == 2, "exactly two endpoint dots"
        assert joined(image, *dots) == bool(label)


def test_pathfinder_is_seeded_and_scales_to_path_x():
    style = PathfinderStyle.for_size(32, 9)
    a, la = generate_batch(3, "val", 5, 6, style)
    b, lb = generate_batch(3, "val", 5, 6, style)
    c, _ = generate_batch(4, "val", 5, 6, style)
    assert np.array_equal(a, b) and np.array_equal(la, lb) and not np.array_equal(a, c)
    big, labels = generate_batch(0, "train", 0, 2, PathfinderStyle.for_size(128))
    assert big.shape == (2, 128, 128)
    for image, label in zip(big, labels):
        dots = markers(image)
        assert joined(image, dots[0], dots[-1]) == bool(label)


def test_pathfinder_task_generated_and_released_layout(tmp_path):
    task = create_task("pathfinder", batch_size=4, seq_len=1024, contour_length=6)
    batch = task.batch("train", 0)
    assert (
        batch["tokens"].shape == (4, 1024)
        and set(batch["tokens"].unique().tolist()) <= {0, 255}
        and batch["targets"].sum() == 2
    )
    directory = write_pathfinder_release(tmp_path / "pathfinder32" / "curv_contour_length_14")
    released = create_task("pathfinder", batch_size=2, seq_len=1024, path=str(directory))
    assert len(released.rows["train"]) == 16 and len(released.rows["test"]) == 2
    test = released.batch("test", 0)
    assert test["targets"].tolist() == [0, 1]  # lines 19, 20 of the metadata: labels 0, 1
    from zoo.data.images import read_png

    assert torch.equal(
        test["tokens"][1], torch.from_numpy(read_png(directory / "imgs/0/sample_19.png").reshape(-1).astype(np.int64))
    )
    with pytest.raises(ValueError, match=r"is 32 x 32 but data.image_size=64"):
        create_task("pathfinder", batch_size=2, seq_len=4096, path=str(directory), image_size=64)
    (directory / "metadata" / "1.npy").write_text("imgs/0 sample_0.png 0\n")
    with pytest.raises(ValueError, match=r"1\.npy:1: expected"):
        create_task("pathfinder", batch_size=2, seq_len=1024, path=str(directory))


# -- each format trains 2 steps through the app ------------------------------------------------------

APP = [
    "logger=csv",
    "trainer.max_steps=2",
    "trainer.eval_every=0",
    "trainer.eval_batches=1",
    "trainer.batch_size=2",
    "trainer.progress=false",
    "trainer.device=cpu",
    "model.d_model=16",
    "model.d_ff=32",
    "model.n_heads=2",
    "model.n_layers=1",
    "model.dropout=0.0",
    "model.attention_dropout=0.0",
]


@pytest.mark.parametrize("case", ["retrieval", "image", "pathfinder", "pathfinder_released", "cifar10", "imagenet64"])
def test_each_format_trains_two_steps_through_the_app(tmp_path, case, cifar_dir):
    pytest.importorskip("hydra")
    from zoo.app.compose import compose
    from zoo.app.run import load_run, run
    from zoo.train.scoring import evaluate_model

    overrides = {
        "retrieval": ["experiment=lra_retrieval", f"data.path={write_aan(tmp_path / 'aan')}", "trainer.seq_len=64"],
        "image": ["experiment=lra_image", f"data.path={cifar_dir}", "data.val_size=4"],
        "pathfinder": ["experiment=lra_pathfinder", "data.contour_length=6", "data.eval_size=2"],
        "pathfinder_released": ["experiment=lra_pathfinder", f"data.path={write_pathfinder_release(tmp_path / 'pf')}"],
        "cifar10": ["experiment=paper/image_transformer_cifar10", f"data.path={cifar_dir}", "data.val_size=4"],
        "imagenet64": [
            "model=vanilla_lm",
            "data=imagenet64",
            f"data.path={write_imagenet(tmp_path / 'in8')}",
            "data.image_size=8",
            "trainer.seq_len=192",
        ],
    }[case]
    value = run(compose(APP + overrides), run_dir=tmp_path / "run")
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "finished" and result["steps"] == 2 and math.isfinite(value)
    assert result["metric"] == ("bpd" if case in ("cifar10", "imagenet64") else "accuracy")
    # the checkpoint, read back in its format's task as evaluate.py does, scores what the run reported
    _, task, model, _ = load_run(tmp_path / "run" / "checkpoints" / "last.pt")
    again = evaluate_model(model, task, "val", 1)
    assert again[f"val/{result['metric']}"] == value and again["val/loss"] == result["val/loss"]


def test_sample_writes_image_grid_whose_completions_keep_the_top_half(tmp_path):
    pytest.importorskip("hydra")

    from zoo.app.compose import compose
    from zoo.app.run import run
    from zoo.data.images import read_png

    data = write_imagenet(tmp_path / "in8")
    run(
        compose(
            APP
            + ["model=vanilla_lm", "data=imagenet64", f"data.path={data}", "data.image_size=8", "trainer.seq_len=192"]
        ),
        run_dir=tmp_path / "run",
    )
    module = load_script("experiments/sample.py")
    png = tmp_path / "grid.png"
    module.main(
        [str(tmp_path / "run" / "checkpoints" / "last.pt"), "--images", "2", "--png", str(png), "--device", "cpu"]
    )
    grid = read_png(png)  # grayscale of an RGB grid: 3 rows of 2 images, 8 px x scale 2, gaps of 2
    cell = 16
    assert grid.shape == (3 * (cell + 2) + 2, 2 * (cell + 2) + 2)
    originals = grid[2 + (cell + 2) : 2 + (cell + 2) + cell]
    completions = grid[2 + 2 * (cell + 2) : 2 + 2 * (cell + 2) + cell]
    assert np.array_equal(originals[: cell // 2], completions[: cell // 2]), "the prompt half is kept"
    assert not np.array_equal(originals[cell // 2 :], completions[cell // 2 :]), "the lower half is generated"


def _fake_run(
    directory: Path, experiment: str, attention: str, accuracy: float | None, model_config: dict | None = None
) -> None:
    directory.mkdir(parents=True)
    status = "finished" if accuracy is not None else "failed: ValueError: no"
    (directory / "result.json").write_text(
        json.dumps(
            {
                "status": status,
                "final_metric": accuracy if accuracy is not None else float("nan"),
                "attention": attention,
                "steps": 2,
            }
        )
    )
    (directory / "config.json").write_text(
        json.dumps(
            {
                "config": {"experiment": experiment, "trainer": {"seq_len": 64}},
                "model_config": model_config or {"attention": {"name": attention}},
            }
        )
    )


def test_lra_tables_layout_average_and_paper_rows(tmp_path):
    from zoo.app.lra import write_lra_tables

    sweep = tmp_path / "sweep"
    # trained with the PyTorch LRA code's padded mean over 32 positions: Table 2 times it at 64 and 128
    tiny = zoo.preset_config(
        "vanilla_classifier", vocab_size=257, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=32
    ).to_dict()
    tiny.update(pooling="padded_mean", pool_length=32)
    accuracies = {
        "lra_listops": 0.2,
        "lra_text": 0.6,
        "lra_retrieval": 0.55,
        "lra_image": 0.3,
        "lra_pathfinder": 0.7,
        "lra_pathx": 0.5,
    }
    k = 0
    for experiment, value in accuracies.items():
        for attention in ("vanilla", "lsh"):
            config = {**tiny, "attention": {"name": attention}} if experiment == "lra_text" else None
            _fake_run(
                sweep / str(k),
                experiment,
                attention,
                None if (attention == "lsh" and experiment == "lra_image") else value,
                config,
            )
            k += 1
    # vanilla's ListOps run was scored on test from its best checkpoint (evaluate.py's log line, then its JSON)
    (sweep / "0" / "test_best.txt").write_text('loading\n{"test/accuracy": 0.25, "step": 2}\n')
    paths = write_lra_tables([sweep], tmp_path / "out", lengths=[64, 128], batch_size=1, steps=1, scale="test scale")
    md = paths["table1_md"].read_text()
    # the test score where there is one; elsewhere the final dev score, marked; avg of the first five
    assert "| vanilla (ours) | 25.00 | 60.00 † | 55.00 † | 30.00 † | 70.00 † | 50.00 † | 48.00 |" in md
    assert "| Transformer (LRA paper) | 36.37 | 64.27 | 57.46 | 42.44 | 71.40 | FAIL | 54.39 |" in md
    assert "| lsh (ours) | 20.00 † | 60.00 † | 55.00 † | error | 70.00 † | 50.00 † |  |" in md
    assert "Reformer (LRA paper)" in md and "† not a test score" in md
    table2 = paths["table2_md"].read_text()
    assert "vanilla (ours) |" in table2 and "(1.0x)" in table2 and "lsh (ours)" in table2 and "test scale" in table2
    assert paths["table1_png"].stat().st_size > 1000 and paths["table2_png"].stat().st_size > 1000


def test_every_lra_row_has_the_papers_figures_and_seeds_are_aggregated(tmp_path):
    """Each of LRA Table 1's eleven rows is named by a registered mechanism (asked of the part, lra_row)
    and printed beside ours, with the Nyströmformer paper's own-setting row where it has one; two seeds of
    one mechanism and task become their mean with the range."""
    from zoo.app.lra import PAPER_NYSTROMFORMER, PAPER_TABLE1, gather_runs, table1
    from zoo.attention.base import ATTENTION

    named = {ATTENTION.get(n).lra_row for n in zoo.list_attention()} - {None}
    assert set(PAPER_TABLE1) <= named and len(PAPER_TABLE1) == 11
    assert set(PAPER_NYSTROMFORMER) <= named
    assert PAPER_TABLE1["BigBird"] == (36.05, 64.02, 59.29, 40.83, 74.87, None, 55.01)
    for k, (attention, value) in enumerate([("performer", 0.2), ("performer", 0.3), ("bigbird", 0.25)]):
        _fake_run(tmp_path / str(k), "lra_listops", attention, value)
    _, rows = table1(gather_runs([tmp_path]))
    text = ["| " + " | ".join(r) + " |" for r in rows]
    assert "| performer (ours) | 25.00 (20.00-30.00, n=2) † |  |  |  |  |  |  |" in text
    assert any(line.startswith("| Performer (LRA paper) | 18.01 | 65.40") for line in text)
    assert any(line.startswith("| Performer (Nyströmformer paper, its setting) | 18.80 | 63.81") for line in text)
    assert any(line.startswith("| BigBird (LRA paper) | 36.05") for line in text)


@pytest.mark.slow
def test_sweep_lra_at_toy_size_writes_both_tables(tmp_path, monkeypatch):
    pytest.importorskip("hydra")
    from support.app_cli import train_main

    from zoo.data.layouts import write_lra_data_dir

    data_dir = write_lra_data_dir(tmp_path / "data")
    sweep = tmp_path / "sweep"
    argv = [
        "sweep=lra",
        f"data_dir={data_dir}",
        "experiment=lra_text,lra_pathfinder",
        "attention=vanilla,local_1d",
        "trainer.eval_batches=1",
        "model.d_model=16",
        "model.n_layers=1",
        "model.n_heads=2",
        "model.d_ff=32",
        "trainer.max_steps=2",
        "trainer.batch_size=2",
        "trainer.eval_every=0",
        "trainer.progress=false",
        "trainer.checkpoints=false",
        "logger=csv",
        "hydra.callbacks.lra_tables.lengths=[128,256]",
        "hydra.callbacks.lra_tables.batch_size=1",
        "hydra.callbacks.lra_tables.steps=1",
        f"hydra.sweep.dir={sweep}",
    ]
    assert train_main(argv, monkeypatch) == 0
    table1 = (sweep / "lra_table1.md").read_text()
    assert "vanilla (ours)" in table1 and "Local Attention (LRA paper)" in table1 and "error" not in table1
    assert "local_1d (ours)" in (sweep / "lra_table2.md").read_text() and (sweep / "lra_table2.png").is_file()


@pytest.mark.parametrize("name", ["image_transformer_cifar10", "image_transformer_cifar10_2d", "sparse_cifar10"])
def test_image_paper_configs_compose_build_and_cite(name, cifar_dir):
    pytest.importorskip("hydra")
    from zoo.app.compose import compose
    from zoo.app.run import build

    cfg = compose(
        [
            f"experiment=paper/{name}",
            f"data.path={cifar_dir}",
            "data.val_size=4",
            "model.n_layers=1",
            "model.d_model=16",
            "model.d_ff=16",
            "model.n_heads=2",
        ]
    )
    assert cfg.paper.dataset == "cifar10" and cfg.paper.value in (2.90, 2.80) and "arXiv" in cfg.paper.citation
    resolved, task, model = build(cfg)
    assert (
        task.seq_len == 3072
        and model.config.vocab_size == 257
        and model.config.attention["name"] == resolved["model"]["attention"]["name"]
    )


def test_imdb_partial_evaluation_sees_both_classes(tmp_path):
    """The tarball lists every negative review before every positive one; scoring the first
    batches of val/test (trainer.eval_batches) must not measure one class only."""
    from zoo.data.layouts import write_imdb

    task = create_task(
        "imdb", batch_size=4, seq_len=16, path=str(write_imdb(tmp_path / "imdb.tar.gz", per_class=20)), val_size=8
    )
    for split in ("val", "test"):
        first = torch.cat([task.batch(split, i)["targets"] for i in range(2)])
        assert 0 < int(first.sum()) < len(first), f"{split}: the first batches hold one class only"


def test_table2_from_a_paired_bench_run(tmp_path):
    """The LRA studies' report: zoo.bench --paired's paired.csv laid out as LRA Table 2 (the speed-up the median of
    per-round ratios, the paper's Transformer row beside ours at its lengths) and runs as Table 1, from rows alone."""
    from zoo.app.lra_speed import measured_from_bench
    from zoo.studies import StudyPaths, create_study
    from zoo.studies.lra_tables import run_row, speed_row

    rows = ["length,variant,baseline,median_ms,speedup,speedup_min,speedup_max,act_mib,rounds,device,threads"]
    for n in (1024, 2048, 3072, 4096):
        rows += [f"{n},vanilla,vanilla,100,1.0,1.0,1.0,4.0,3,cpu,1", f"{n},linear,vanilla,50,2.1,1.9,2.2,2.0,3,cpu,1"]
    (tmp_path / "paired.csv").write_text("\n".join(rows) + "\n")
    runs = [dict(experiment="lra_listops", attention=a, accuracy=acc, split="test", status="finished", steps=4,
                 seq_len=32) for a, acc in (("vanilla", 30.0), ("linear", 20.0), ("linear", 22.0))]
    study_rows = [run_row(r, seed) for r, seed in zip(runs, (0, 0, 1))]
    study_rows += [speed_row(m) for m in measured_from_bench(tmp_path / "paired.csv")]
    as_read = [{k: "" if v is None else str(v) for k, v in r.items()} for r in study_rows]  # as rows.csv gives them
    study = create_study("lra_family", StudyPaths(out=tmp_path, runs=tmp_path))
    md = study.report(as_read)
    assert "| linear (ours) | 20.00 (2.1x) |" in md and "2 MiB (0.50x)" in md
    assert "| Transformer (LRA paper) | 8.1 (1.0x)" in md and (tmp_path / "lra_table2.png").stat().st_size > 1000
    assert "| linear (ours) | 21.00 (20.00-22.00, n=2) |" in md and "faster than vanilla at 4,096 tokens: linear" in md
