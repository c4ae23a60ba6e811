"""The Reformer duplication study: each mode's attention reaches the app, the verdict reads the paper's three
patterns from the rows, ours and reformer-pytorch train through the shared step loop exactly as a plain loop
would, a finished run is not trained again, and our paper-style LSH equals the peer's given its rotations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo.app.csv_rows import read_rows
from zoo.data.synthetic import duplication_batch
from zoo.presets.reformer import duplication_model
from zoo.studies import StudyPaths, create_study
from zoo.studies.reformer_duplication import OURS, ReformerDuplication
from zoo.studies.reformer_peer import PEERS, build_peer, peer_module
from zoo.train.steps import after_optimizer_step

SMALL = dict(length=16, chunk=4, d_model=16, heads=2, n_symbols=8, batch=4, lr=5e-3, eval_sequences=64)


def test_each_modes_attention_reaches_the_app(tmp_path):
    study = create_study("reformer_duplication", StudyPaths(out=tmp_path, runs=tmp_path), chunk=16)
    assert "attention=shared_qk" in study.train_overrides("full")
    assert {"attention=lsh", "attention.n_hashes=2", "attention.chunk_size=16"} <= set(study.train_overrides("lsh2"))
    assert "model.tie_embeddings=false" in study.train_overrides("full")  # untied as the paper's and the peer's


def test_an_unknown_implementation_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="study.impls: each of app, ours-window"):
        create_study("reformer_duplication", StudyPaths(out=tmp_path, runs=tmp_path), impls=["theirs"])


def test_verdict_counts_each_of_the_papers_patterns():
    def table(lsh8: float, full_drop: float, lsh_at_full: float) -> dict:
        return {("ours-window", "lsh4", "lsh8"): (lsh8, lsh8, lsh8, 1),
                ("ours-window", "lsh4", "full"): (lsh_at_full,) * 3 + (1,),
                ("ours-window", "full", "lsh8"): (99.0, 99.0, 99.0, 1),
                ("ours-window", "full", "lsh1"): (99.0 - full_drop,) * 3 + (1,)}

    assert "3 of 3 of the paper's patterns" in ReformerDuplication.verdict(table(95.0, 40.0, 0.8))
    verdict = ReformerDuplication.verdict(table(10.0, 0.0, 100.0))
    assert "0 of 3" in verdict and "keep >= 90% with LSH-8 (lowest 10.0%): 0 of 1" in verdict


def test_a_finished_run_is_not_trained_again(tmp_path, monkeypatch):
    study = create_study("reformer_duplication", StudyPaths(out=tmp_path, runs=tmp_path), impls=["ours-window"],
                         train=["lsh2"], evals=["lsh2"], seeds=[0], steps=2, log_every=1, **SMALL)
    study.run()
    rows = study.rows_path.read_bytes()
    assert [r["step"] for r in read_rows(study.rows_path) if r["kind"] == "curve"] == ["1", "2"]
    monkeypatch.setattr(study, "in_loop", lambda *args: pytest.fail("trained again"))
    study.run()
    assert study.rows_path.read_bytes() == rows


@pytest.mark.parametrize("impl", ["ours-chunk", "peer"])
def test_the_shared_loop_trains_as_the_plain_loop_it_replaced(impl, tmp_path, stepped_losses):
    """Ours and the peer train through the app's train_step in the studies' step loop; a few steps give the
    losses of a plain loop (cross-entropy on the logits, Adam, clip 1.0, post-step hooks), bitwise."""
    if impl in PEERS and peer_module() is None:
        pytest.skip("reformer-pytorch is not installed")
    study = create_study("reformer_duplication", StudyPaths(out=tmp_path, runs=tmp_path), impls=[impl],
                         train=["lsh2"], seeds=[0], steps=3, log_every=100, **SMALL)
    held_out = [duplication_batch(64, SMALL["length"], n_symbols=SMALL["n_symbols"])]
    study.in_loop(impl, "lsh2", 0, held_out)
    torch.manual_seed(0)
    sizes = study.sizes()
    model = build_peer(impl, "lsh2", **sizes) if impl in PEERS else duplication_model(
        "lsh2", **sizes, tie_embeddings=False, **OURS[impl])
    optimizer = torch.optim.Adam(model.parameters(), lr=SMALL["lr"])
    g = torch.Generator().manual_seed(0)
    expected = []
    for _ in range(3):
        model.train()
        batch = duplication_batch(SMALL["batch"], SMALL["length"], n_symbols=SMALL["n_symbols"], generator=g)
        logits = model(batch["tokens"]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        after_optimizer_step(model)
        expected.append(float(loss.detach()))
    assert stepped_losses == expected


@pytest.mark.parametrize("n_hashes", [1, 4])
@pytest.mark.parametrize("across", [False, True], ids=["in_bucket", "across_buckets"])
def test_our_paper_look_back_equals_reformer_pytorch_given_its_rotations(n_hashes, across):
    """Same weights, inputs and random rotations through zoo's lsh (look_back="chunk") and
    reformer-pytorch's LSHSelfAttention: the mechanisms agree. Exactly at 1 hash; at 4 hashes in
    bucket up to the peer's float32 logsumexp over rounds whose only key is the query itself
    (self score -5e4, where float32 steps are 0.004: weights off by ~0.2%). Across buckets with
    several hashes the peer's rounds share one sorted sequence, so a round's first chunk looks back
    into the previous round's last chunk (ours wraps within the round): only 1 hash is compared."""
    if across and n_hashes > 1:
        pytest.skip("the peer's chunk 0 looks back into the previous round: a different key set by design")
    peer_lib = pytest.importorskip("reformer_pytorch.reformer_pytorch")
    import torch

    from zoo.attention.lsh import LSHAttention

    torch.manual_seed(0)
    b, t, d, h, c = 2, 64, 32, 2, 8
    x = torch.randn(b, t, d)
    peer = peer_lib.LSHSelfAttention(
        d, heads=h, bucket_size=c, n_hashes=n_hashes, causal=True, attend_across_buckets=across
    ).eval()
    rotations = torch.randn(1, d // h, n_hashes, t // c // 2)  # the peer's shape: shared by the heads
    outputs = {}
    for look_back in ("chunk", "window"):
        ours = LSHAttention(
            d,
            h,
            causal=True,
            bias=False,
            n_hashes=n_hashes,
            chunk_size=c,
            look_back=look_back,
            attend_across_buckets=across,
        ).eval()
        with torch.no_grad():  # the peer's output projection has a bias, its QK and V projections none
            ours.to_qk.weight.copy_(peer.toqk.weight)
            ours.to_v.weight.copy_(peer.tov.weight)
            ours.to_out = torch.nn.Linear(d, d)
            ours.to_out.load_state_dict(peer.to_out.state_dict())
        ours.rotations = lambda n_buckets, device, dtype: rotations[0].expand(h, -1, -1, -1)
        outputs[look_back] = ours(x).out
    draw = torch.randn
    try:
        torch.randn = lambda *args, **kwargs: rotations.clone()  # the peer draws its rotations here
        expected = peer(x)
    finally:
        torch.randn = draw
    tolerance = 1e-5 if n_hashes == 1 else 5e-3
    torch.testing.assert_close(outputs["chunk"], expected, atol=tolerance, rtol=0)
    if not across:  # the strictly causal window is a different key set: it must differ somewhere
        assert (outputs["window"] - expected).abs().max() > 10 * tolerance
