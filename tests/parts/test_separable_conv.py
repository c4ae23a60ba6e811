"""The Universal Transformer's separable-convolution transition (zoo/feed_forward/sepconv.py): equal to a
plain full convolution with the factorised weight, causal by perturbation, blind to padding, a part of
the feed-forward axis (``feed_forward=sepconv``), and still built from a config written before the axis
(the universal stack's ``transition`` option)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo.config import merge_config
from zoo.feed_forward.mlp import MLP
from zoo.feed_forward.sepconv import SeparableConv1d, SeparableConvTransition
from zoo.presets.factory import get_preset


def full_conv_reference(conv: SeparableConv1d, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """One ordinary (non-separable) convolution with weight W[o, c, j] = P[o, c] * D[c, j]."""
    k = conv.kernel_size
    weight = conv.pointwise.weight[:, :, None] * conv.depthwise[:, 0][None, :, :]  # [out, in, k]
    left, right = (k - 1, 0) if causal else ((k - 1) // 2, k // 2)
    padded = F.pad(x.transpose(1, 2), (left, right))  # [b, in, t + k - 1]
    return F.conv1d(padded, weight, conv.pointwise.bias).transpose(1, 2)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kernel_size", [1, 3, 4])
def test_separable_conv_equals_the_factorised_full_convolution(causal, kernel_size):
    torch.manual_seed(0)
    conv = SeparableConv1d(6, 5, kernel_size, causal=causal)
    x = torch.randn(2, 9, 6)
    torch.testing.assert_close(conv(x), full_conv_reference(conv, x, causal), atol=1e-5, rtol=1e-5)
    # and by hand at one position: output i reads inputs i - k + 1 .. i (causal)
    if causal:
        i = 7
        window = x[0, i - kernel_size + 1 : i + 1]  # [k, in]
        depthwise = (window.T * conv.depthwise[:, 0]).sum(-1)  # [in]
        torch.testing.assert_close(conv(x)[0, i], conv.pointwise(depthwise), atol=1e-5, rtol=1e-5)


def test_transition_is_two_separable_convolutions_with_the_activation_between():
    torch.manual_seed(0)
    transition = SeparableConvTransition(6, 10, kernel_size=3, causal=True)
    x = torch.randn(2, 8, 6)
    hidden = F.relu(full_conv_reference(transition.conv1, x, True))
    torch.testing.assert_close(transition(x), full_conv_reference(transition.conv2, hidden, True), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_causality_by_perturbation(causal):
    """Causal: changing input j changes no output before j. Bidirectional (the control that shows
    the check can fail): it does change outputs before j, within the two layers' reach."""
    torch.manual_seed(0)
    transition = SeparableConvTransition(4, 8, kernel_size=3, causal=causal)
    x = torch.randn(1, 12, 4)
    j = 6
    y = x.clone()
    y[0, j] += 1.0
    a, b = transition(x), transition(y)
    changed = (a - b).abs().amax(-1)[0] > 1e-6  # [t]
    assert changed[j]
    if causal:
        assert not changed[:j].any()
        assert changed[j : j + 5].all(), "two kernel-3 layers reach 4 positions ahead"
    else:
        assert changed[j - 2 : j].all()


def test_padded_positions_never_reach_real_ones():
    torch.manual_seed(0)
    transition = SeparableConvTransition(4, 8, kernel_size=5, causal=False)
    x = torch.randn(2, 10, 4)
    pad_mask = torch.ones(2, 10, dtype=torch.bool)
    pad_mask[0, 7:] = False
    noisy = torch.where(pad_mask[..., None], x, torch.randn_like(x) * 10)
    real = pad_mask
    torch.testing.assert_close(transition(x, pad_mask)[real], transition(noisy, pad_mask)[real])
    # without the mask the padding would leak into the last real positions
    assert not torch.allclose(transition(x)[real], transition(noisy)[real])


def sepconv_model(name, **options):
    preset = get_preset(name)
    overrides = merge_config(preset.tiny, {"feed_forward": {"name": "sepconv", **options}})
    return zoo.create_model(name, **overrides)


def test_the_feed_forward_axis_builds_the_transition():
    model = sepconv_model("universal_transformer", kernel_size=5)
    ffn = model.stack.block.feed_forward
    assert isinstance(ffn, SeparableConvTransition) and ffn.conv1.kernel_size == 5 and ffn.conv1.causal
    widths = (ffn.conv1.pointwise.out_features, ffn.conv2.pointwise.out_features)
    assert widths == (model.config.d_ff, model.config.d_model)
    seq2seq = sepconv_model("universal_seq2seq_act")
    assert not seq2seq.encoder.block.feed_forward.conv1.causal, "the encoder is bidirectional"
    assert seq2seq.decoder.block.feed_forward.conv1.causal
    assert seq2seq.encoder.block.feed_forward.conv1.kernel_size == 3  # the default
    plain = zoo.create_model("universal_transformer", **get_preset("universal_transformer").tiny)
    assert isinstance(plain.stack.block.feed_forward, MLP)
    with pytest.raises(ValueError, match="kernel_size must be an int >= 1"):
        sepconv_model("universal_transformer", kernel_size=0)


def test_a_config_from_before_the_axis_builds_the_same_transition():
    """``stack.transition=sepconv`` (and ``kernel_size``), the universal stack's options before the
    feed-forward axis: the same part, the same parameter names, so its checkpoints load."""
    tiny = get_preset("universal_transformer").tiny
    old = zoo.create_model(
        "universal_transformer", **merge_config(tiny, {"stack": {"transition": "sepconv", "kernel_size": 5}})
    )
    new = sepconv_model("universal_transformer", kernel_size=5)
    assert old.config.feed_forward == {"name": "sepconv", "kernel_size": 5} and "transition" not in old.config.stack
    assert old.state_dict().keys() == new.state_dict().keys()
    old.load_state_dict(new.state_dict())
    assert isinstance(
        zoo.create_model("universal_transformer", stack={"transition": "ffn"}).stack.block.feed_forward, MLP
    )
    with pytest.raises(ValueError, match="feed_forward=swiglu|feed_forward is 'swiglu'"):
        zoo.create_model("universal_transformer", stack={"transition": "sepconv"}, feed_forward="swiglu")
    with pytest.raises(ValueError, match="transition must be one of ffn, sepconv"):
        zoo.create_model("universal_transformer", stack={"transition": "conv"})
    with pytest.raises(ValueError, match="kernel_size=5 applies only to transition='sepconv'"):
        zoo.create_model("universal_transformer", stack={"kernel_size": 5})
    with pytest.raises(ValueError, match="kernel_size must be an int >= 1"):
        zoo.create_model("universal_transformer", stack={"transition": "sepconv", "kernel_size": 0})


@pytest.mark.parametrize("name", ["universal_transformer", "universal_transformer_act"])
def test_causal_universal_model_with_sepconv_by_perturbation(name):
    torch.manual_seed(0)
    model = sepconv_model(name).eval()
    tokens = torch.randint(0, 32, (2, 16))
    j = 9
    other = tokens.clone()
    other[:, j] = (other[:, j] + 1) % 32
    with torch.no_grad():
        a, b = model(tokens).logits, model(other).logits
    torch.testing.assert_close(a[:, :j], b[:, :j])
    assert not torch.allclose(a[:, j:], b[:, j:])


def test_encoder_with_sepconv_ignores_padding_and_the_model_learns():
    torch.manual_seed(0)
    model = sepconv_model("universal_seq2seq_act").eval()
    src = torch.randint(3, 32, (2, 12))
    src_pad_mask = torch.ones(2, 12, dtype=torch.bool)
    src_pad_mask[1, 8:] = False
    other = torch.where(src_pad_mask, src, torch.randint(3, 32, src.shape))
    with torch.no_grad():
        a = model.encode(src, src_pad_mask)
        b = model.encode(other, src_pad_mask)
    torch.testing.assert_close(a[src_pad_mask], b[src_pad_mask])
    lm = sepconv_model("universal_transformer").train()
    opt = torch.optim.Adam(lm.parameters(), lr=3e-3)
    tokens = torch.randint(0, 32, (4, 17))
    losses = []
    for _ in range(20):
        out = lm(tokens[:, :-1], tokens[:, 1:])
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_hydra_reaches_transition_and_head():
    """``model.head`` and the transition are set from the command line (the feed-forward group, and the
    universal stack's old key), also on top of ``experiment=tiny`` whose tiny variant has no ``stack``
    entry to merge into."""
    pytest.importorskip("hydra")
    from zoo.app.compose import compose
    from zoo.app.run import build

    base = ["experiment=tiny", "model=universal_transformer", "trainer.seq_len=16", "trainer.batch_size=2"]
    overrides = ["+model.stack.transition=sepconv", "+model.stack.kernel_size=5", "model.head=none"]
    _, _, model = build(compose(base + overrides))
    assert model.config.stack == {"name": "universal"}
    assert model.config.feed_forward == {"name": "sepconv", "kernel_size": 5}
    assert model.stack.block.feed_forward.conv1.kernel_size == 5 and model.head is None
    _, _, model = build(compose(base + ["feed_forward=sepconv", "feed_forward.kernel_size=5"]))
    assert model.config.feed_forward == {"name": "sepconv", "kernel_size": 5}
    _, _, model = build(compose(base))
    assert isinstance(model.stack.block.feed_forward, MLP) and model.head is not None


def test_a_model_with_sepconv_refuses_a_state_and_the_reversible_stack_with_the_reason():
    from zoo.parallel.context import context_refusal

    model = zoo.create_model("vanilla_lm", **get_preset("vanilla_lm").tiny, feed_forward="sepconv")
    assert "sepconv" in model.stream_refusal()
    assert "neighbouring positions" in context_refusal(model)  # a chunk on another rank holds them
    assert (
        context_refusal(zoo.create_model("vanilla_lm", **get_preset("vanilla_lm").tiny, feed_forward="swiglu")) is None
    )
    with pytest.raises(ValueError, match="neighbouring positions"):
        zoo.create_model("reformer", **get_preset("reformer").tiny, feed_forward="sepconv")
