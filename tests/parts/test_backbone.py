"""Every preset as a sequence backbone: vectors in (``embeds=``), hidden states out
(``ModelOutput.hidden``), ``head="none"``, and the memory contract on the vector path.

Parametrised over ``zoo.list_models()``; a preset's ``tiny`` overrides give its CPU-second size."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.presets.factory import get_preset

# the two-tower pair classifier reads [b, 2, t] pairs; its own test covers embeds/hidden/head="none"
MODELS = [m for m in zoo.list_models() if zoo.preset_config(m).kind != "pair_classifier"]


def tiny(name, **extra):
    return zoo.create_model(name, **{**get_preset(name).tiny, **extra}).eval()


def token_ids(model, name, b=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (b, get_preset(name).example_length), generator=g)


def call(model, ids=None, vectors=None, **kwargs):
    """The model on token ids or on vectors (the seq2seq model gets the same sequence on both sides)."""
    if model.config.kind == "seq2seq":
        if vectors is not None:
            return model(src_embeds=vectors, tgt_embeds=vectors, **kwargs)
        return model(ids, ids, **kwargs)
    return model(ids, **kwargs) if vectors is None else model(embeds=vectors, **kwargs)


def embedding(model):
    return model.tgt_embed if model.config.kind == "seq2seq" else model.embed


@pytest.mark.parametrize("name", MODELS)
def test_vectors_in_equal_the_embedded_tokens(name):
    """embeds = the model's own scaled token embedding reproduces the token path exactly: only the
    lookup (and its sqrt(d) scale) is skipped; position signal, stack and norm all still run."""
    torch.manual_seed(0)
    model = tiny(name)
    ids = token_ids(model, name)
    with torch.no_grad():
        vectors = embedding(model)(ids)  # [b, t, d] (includes the sqrt(d) scale)
        from_ids, from_vectors = call(model, ids), call(model, vectors=vectors)
    assert from_vectors.hidden.shape == (*ids.shape, model.config.d_model)
    torch.testing.assert_close(from_vectors.hidden, from_ids.hidden)
    torch.testing.assert_close(from_vectors.logits, from_ids.logits)
    # vectors that are not embedded tokens change the output: the input really is read
    with torch.no_grad():
        other = call(model, vectors=vectors + torch.randn_like(vectors))
    assert not torch.allclose(other.hidden, from_ids.hidden)


@pytest.mark.parametrize("name", MODELS)
def test_hidden_is_what_the_head_reads(name):
    """hidden is the final hidden state after the final norm: the head applied to it gives the logits."""
    model = tiny(name)
    ids = token_ids(model, name)
    with torch.no_grad():
        out = call(model, ids)
        if model.config.kind == "classifier":  # pooled as the preset says: the first position or the mean
            pooled = out.hidden[:, 0] if model.config.pooling == "first" else out.hidden.mean(1)
            expected = model.head(pooled)
        else:
            expected = out.hidden @ model.head.weight.T
    torch.testing.assert_close(out.logits, expected)
    norm = model.decoder_norm if model.config.kind == "seq2seq" else model.norm
    if isinstance(norm, torch.nn.LayerNorm):  # normed: zero mean, unit variance per position
        torch.testing.assert_close(out.hidden.mean(-1), torch.zeros(out.hidden.shape[:2]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", MODELS)
def test_head_none_returns_hidden_only_and_refuses_targets(name):
    torch.manual_seed(0)
    with_head = tiny(name)
    backbone = tiny(name, head="none")
    assert backbone.head is None and not any(n.startswith("head.") for n, _ in backbone.named_parameters())
    tied = with_head.config.tie_embeddings and with_head.config.kind != "classifier"  # the head is the token table
    head_size = 0 if tied else sum(p.numel() for p in with_head.head.parameters())
    assert backbone.num_parameters == with_head.num_parameters - head_size
    missing, unexpected = backbone.load_state_dict(with_head.state_dict(), strict=False)
    assert not missing
    ids = token_ids(with_head, name)
    with torch.no_grad():
        out = call(backbone, vectors=embedding(with_head)(ids))
        reference = call(with_head, ids)
    assert out.logits is None
    torch.testing.assert_close(out.hidden, reference.hidden)
    targets = torch.zeros(ids.shape[0], dtype=torch.long) if with_head.config.kind == "classifier" else ids
    with pytest.raises(ValueError, match="head='none'"):
        call(backbone, ids, targets=targets)
    if hasattr(backbone, "generate") and backbone.config.kind != "classifier":
        with pytest.raises(ValueError, match="head='none'"):
            backbone.generate(ids, 2) if backbone.config.kind == "lm" else backbone.generate(ids, max_len=2)


def test_head_none_backbone_learns_with_a_caller_head():
    """The use the option exists for: a caller's own head on out.hidden, trained end to end."""
    torch.manual_seed(0)
    backbone = zoo.create_model("gtrxl", **{**get_preset("gtrxl").tiny, "head": "none"})
    head = torch.nn.Linear(32, 1)
    params = list(backbone.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=3e-3)
    x = torch.randn(4, 10, 32)
    y = x[..., :1].cumsum(1) / 4  # needs the past: a running sum of the first feature
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.mse_loss(head(backbone(embeds=x).hidden), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]
    untrained = [n for n, p in backbone.named_parameters() if p.grad is None]
    assert untrained == ["embed.weight"], "every weight but the unused token table is trained through hidden"


def memory_presets():
    out = []
    for name in MODELS:
        model = tiny(name)
        if model.attentions_keep_state() and model.config.kind in ("lm", "seq2seq"):
            out.append(name)
    return out


MEMORY = memory_presets()


def test_memory_presets_include_the_recurrent_family():
    assert {"transformer_xl", "gtrxl", "trxl_i", "adaptive_span_lm", "vanilla_lm"} <= set(MEMORY)


@pytest.mark.parametrize("name", MEMORY)
def test_segments_of_vectors_with_state_equal_one_call(name):
    """Vectors fed in segments (one of them a single step, as an agent would) with the returned
    state == one call on their concatenation, for hidden states and logits."""
    torch.manual_seed(0)
    model = tiny(name)
    x = torch.randn(3, 14, model.config.d_model)
    splits = (6, 1, 1, 6)
    with torch.no_grad():
        if model.config.kind == "seq2seq":
            src = torch.randn(3, 9, model.config.d_model)
            full = model(src_embeds=src, tgt_embeds=x)
            state = model.init_state(src_embeds=src)
            run = lambda piece, state: model(tgt_embeds=piece, state=state)  # noqa: E731
        else:
            full = model(embeds=x)
            state = model.init_state(3)
            run = lambda piece, state: model(embeds=piece, state=state)  # noqa: E731
        hidden, logits = [], []
        for piece in x.split(splits, dim=1):
            out = run(piece, state)
            state = out.state
            hidden.append(out.hidden)
            logits.append(out.logits)
    torch.testing.assert_close(torch.cat(hidden, 1), full.hidden, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat(logits, 1), full.logits, atol=1e-4, rtol=1e-4)
    assert state.offset == sum(splits)


@pytest.mark.parametrize("name", MODELS)
def test_padding_on_the_vector_path(name):
    """Changing padded vectors never changes the hidden states of real positions."""
    torch.manual_seed(0)
    model = tiny(name)
    b, t, d = 2, get_preset(name).example_length, model.config.d_model
    x = torch.randn(b, t, d)
    pad_mask = torch.ones(b, t, dtype=torch.bool)
    pad_mask[1, -5:] = False
    noisy = torch.where(pad_mask[..., None], x, torch.randn_like(x) * 10)
    with torch.no_grad():
        if model.config.kind == "seq2seq":
            a = model(src_embeds=x, tgt_embeds=x, src_pad_mask=pad_mask, tgt_pad_mask=pad_mask).hidden
            c = model(src_embeds=noisy, tgt_embeds=noisy, src_pad_mask=pad_mask, tgt_pad_mask=pad_mask).hidden
        else:
            a, c = model(embeds=x, pad_mask=pad_mask).hidden, model(embeds=noisy, pad_mask=pad_mask).hidden
    torch.testing.assert_close(a[pad_mask], c[pad_mask], atol=1e-5, rtol=1e-5)


def test_bad_vector_inputs_are_refused_clearly():
    model = tiny("gtrxl")
    ids = torch.randint(0, 32, (2, 5))
    x = torch.randn(2, 5, 32)
    with pytest.raises(ValueError, match="exactly one of tokens .* or embeds.*got both"):
        model(ids, embeds=x)
    with pytest.raises(ValueError, match="exactly one of tokens .* or embeds.*got neither"):
        model()
    with pytest.raises(ValueError, match="width 48 but the model's d_model is 32"):
        model(embeds=torch.randn(2, 5, 48))
    with pytest.raises(ValueError, match=r"float tensor \[b, t, d_model=32\]"):
        model(embeds=ids)
    with pytest.raises(ValueError, match=r"float tensor \[b, t, d_model=32\]"):
        model(embeds=torch.randn(5, 32))
    with pytest.raises(ValueError, match="dtype torch.float64"):
        model(embeds=x.double())
    with pytest.raises(ValueError, match="pad_mask must be a bool tensor"):
        model(embeds=x, pad_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="head must be linear .* or none"):
        zoo.create_model("gtrxl", head="identity")
    seq2seq = tiny("vanilla_seq2seq")
    with pytest.raises(ValueError, match="exactly one of src .* or src_embeds.*got both"):
        seq2seq(ids, ids, src_embeds=x)
    with pytest.raises(ValueError, match="exactly one of tgt .* or tgt_embeds.*got neither"):
        seq2seq(ids)
    with pytest.raises(ValueError, match="src_embeds has width 16 but the model's d_model is 32"):
        seq2seq(tgt=ids, src_embeds=torch.randn(2, 5, 16))
    classifier = tiny("vanilla_classifier")
    with pytest.raises(ValueError, match=r"classifier targets must be \[b\] = \(2,\)"):
        classifier(embeds=x, targets=torch.zeros(3, dtype=torch.long))
