"""Reversible stack (RevNet coupling, Reformer Section 3) and the chunked feed-forward.

Recomputed gradients equal stored ones for every additive residual: tests/contracts/test_residual_contract.py;
aux losses and per-layer stats: tests/contracts/test_stack_contract.py."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.feed_forward.mlp import MLP as FeedForward

SMALL = dict(
    vocab_size=40,
    d_model=32,
    n_heads=4,
    d_ff=96,
    dropout=0.1,
    attention_dropout=0.1,
    attention={"chunk_size": 8, "n_hashes": 2},
    ff_chunk_size=8,
)


def batch(b=2, t=30, vocab=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (b, t + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def test_dropout_actually_differs_between_seeds():
    """Guard for test_residual_contract's reversible-gradient check (run for every additive residual):
    dropout is live, so equal gradients needed the RNG restore."""
    model = zoo.create_model("reformer", n_layers=2, **SMALL).train()
    tokens, targets = batch()
    torch.manual_seed(1)
    a = model(tokens, targets).loss
    torch.manual_seed(2)
    assert not torch.allclose(a, model(tokens, targets).loss)


def test_autograd_grad_sees_parameters_and_inputs():
    stack = zoo.create_model("reformer", n_layers=2, **{**SMALL, "dropout": 0.0, "attention_dropout": 0.0}).stack
    plain = zoo.create_model(
        "reformer", n_layers=2, **{**SMALL, "dropout": 0.0, "attention_dropout": 0.0, "stack": {"recompute": False}}
    ).stack
    plain.load_state_dict(stack.state_dict())
    x = torch.randn(2, 20, 32, requires_grad=True)
    params = list(stack.parameters())
    got = torch.autograd.grad(stack(x).x.square().sum(), [x, *params])
    want = torch.autograd.grad(plain(x).x.square().sum(), [x, *plain.parameters()])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def activation_bytes(model, tokens, targets) -> int:
    """Bytes of the distinct tensors autograd saves for backward, parameters excluded."""
    params = {p.data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens, targets)  # what forward leaves for backward (the recompute's own is transient)
    return sum(seen.values())


def test_activation_memory_is_flat_in_depth():
    tokens, targets = batch(b=2, t=32)
    memory = {}
    for stack in ("reversible", "sequential"):
        for layers in (2, 12):
            torch.manual_seed(0)
            model = zoo.create_model(
                "reformer", n_layers=layers, stack=stack, **{**SMALL, "dropout": 0.0, "attention_dropout": 0.0}
            )
            memory[stack, layers] = activation_bytes(model, tokens, targets)
    assert memory["reversible", 12] <= 1.25 * memory["reversible", 2], memory
    assert memory["sequential", 12] > 3 * memory["sequential", 2], memory  # the counter does count layers


def test_feed_forward_activation_never_exists_whole():
    """In the recomputing backward the [b, t, d_ff] activation is only ever built one chunk at a time."""
    d_ff, t, chunk = 96, 64, 8
    model = zoo.create_model("reformer", n_layers=2, **{**SMALL, "d_ff": d_ff, "ff_chunk_size": chunk})
    tokens, targets = batch(b=2, t=t)
    widest = []
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(x):
        if x.dim() >= 2 and x.shape[-1] == d_ff and x.untyped_storage().data_ptr() not in params:
            widest.append(x.numel())
        return x

    loss = model(tokens, targets).loss
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        loss.backward()  # the recomputation happens here
    assert widest and max(widest) <= 2 * chunk * d_ff < 2 * t * d_ff


def test_chunked_feed_forward_equals_unchunked():
    ff = FeedForward(16, 48, chunk_size=5)
    whole = FeedForward(16, 48)
    whole.load_state_dict(ff.state_dict())
    x = torch.randn(3, 23, 16)
    torch.testing.assert_close(ff(x), whole(x))
    chunked = zoo.create_model(
        "reformer", n_layers=2, **{**SMALL, "dropout": 0.0, "attention_dropout": 0.0, "ff_chunk_size": 7}
    ).eval()
    unchunked = zoo.create_model(
        "reformer", n_layers=2, **{**SMALL, "dropout": 0.0, "attention_dropout": 0.0, "ff_chunk_size": 0}
    ).eval()
    unchunked.load_state_dict(chunked.state_dict())
    tokens, _ = batch()
    torch.testing.assert_close(chunked(tokens).logits, unchunked(tokens).logits, atol=1e-5, rtol=1e-4)


def test_refused_at_build_time_with_the_reason():
    not_additive = next(n for n in zoo.list_residuals() if not zoo.RESIDUAL.get(n).additive)
    additive = next(n for n in zoo.list_residuals() if zoo.RESIDUAL.get(n).additive)
    with pytest.raises(ValueError, match=f"additive.*{not_additive}"):
        zoo.create_model("reformer", residual=not_additive, **SMALL)
    with pytest.raises(ValueError, match="carries memory from one training segment"):
        zoo.create_model("reformer", **{**SMALL, "attention": {"name": "vanilla", "max_cache": 8}})
    with pytest.raises(ValueError, match="cross-attention"):
        zoo.create_model(
            "vanilla_seq2seq",
            d_model=32,
            n_heads=4,
            d_ff=32,
            n_layers=1,
            residual=additive,
            stack="reversible",
            attention="shared_qk",
        )
    model = zoo.create_model("reformer", n_layers=1, **SMALL)
    with pytest.raises(ValueError, match="only without gradients"):
        model.stack(torch.randn(1, 8, 32), state=[object()])


def test_generation_streams_through_the_reversible_stack_without_gradients():
    """Without gradients nothing is recomputed, so the stack threads its layers' caches: a Reformer with
    a fixed bucket count continues a sequence exactly (token by token == one call), and generate()
    takes the cached path; with gradients a state is refused, saying why."""
    model = zoo.create_model("reformer", n_layers=2, **{**SMALL, "attention": {"n_buckets": 4}}).eval()
    assert model.attentions_keep_state()
    tokens = torch.randint(0, SMALL["vocab_size"], (2, 21))
    with torch.no_grad():
        whole = model(tokens).logits
        state, pieces = model.init_state(2), []
        for i in range(tokens.shape[1]):
            out = model(tokens[:, i : i + 1], state=state)
            state = out.state
            pieces.append(out.logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="only without gradients"):
        model(tokens[:, :3], state=model.init_state(2))
