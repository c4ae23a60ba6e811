"""``transformer_pp`` equals Hugging Face's ``LlamaForCausalLM`` with weights copied (zoo.convert).

The reference is the installed ``transformers`` (skipped cleanly where absent). HF's Llama upcasts to
float32 inside RMSNorm and the rotary table (its ``.float()`` / ``torch.float32``), which in a float64
model is a downcast: for the 1e-10 comparison those upcasts are made float64 while the reference runs
(``float64_reference``), its code otherwise untouched; unpatched, the two agree to float32 precision.
Each piece (norm, gate, rotary layout, GQA grouping) is broken once below and the equality must fail.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch

import zoo
from zoo.convert import from_llama, to_llama

transformers = pytest.importorskip("transformers")

VOCAB = 61


@contextlib.contextmanager
def float64_reference():
    """HF Llama's float32 upcasts (RMSNorm's variance, the rotary table) in float64 while it runs."""
    with (
        mock.patch.object(torch, "float32", torch.float64),
        mock.patch.object(torch, "float", torch.float64),
        mock.patch.object(torch.Tensor, "float", torch.Tensor.double),
    ):
        yield


def llama(n_kv_heads=4, tie=False, seed=0):
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=56,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=500.0,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(seed)
    with float64_reference():
        model = transformers.LlamaForCausalLM(config).double().eval()
    with torch.no_grad():  # norm weights away from 1, so a norm mapped to the wrong place shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model


def tokens(t=40, seed=1):
    return torch.randint(0, VOCAB, (2, t), generator=torch.Generator().manual_seed(seed))


def reference_logits(hf, x):
    with float64_reference(), torch.no_grad():
        return hf(x).logits


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_transformer_pp_equals_llama_with_weights_copied(n_kv_heads):
    hf = llama(n_kv_heads)
    model = from_llama(hf).eval()
    assert model.config.name == "transformer_pp" and model.stack.blocks[0].attention.n_kv_heads == n_kv_heads
    x = tokens()
    with torch.no_grad():
        ours = model(x).logits
    assert (ours - reference_logits(hf, x)).abs().max() < 1e-10
    with torch.no_grad():  # the reference as it runs unpatched: float32 inside, float32 precision
        torch.testing.assert_close(ours, hf(x).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads,tie", [(4, True), (1, False)], ids=["tied", "mqa"])
def test_greedy_generation_is_token_for_token_llamas(n_kv_heads, tie):
    hf = llama(n_kv_heads, tie=tie, seed=2)
    model = from_llama(hf)
    assert model.config.tie_embeddings == tie
    prompt = tokens(7, seed=3)
    ours = model.generate(prompt, 30, greedy=True)
    with float64_reference():
        theirs = hf.generate(prompt, max_new_tokens=30, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs)


def test_to_llama_round_trips():
    model = zoo.create_model(
        "transformer_pp", vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, d_ff=40, attention={"n_kv_heads": 2}
    ).double()
    with float64_reference():  # HF computes its rotary table when built
        hf = to_llama(model).eval()
    assert hf.config.num_key_value_heads == 2 and hf.config.intermediate_size == 40
    x = tokens()
    with torch.no_grad():
        assert (model.eval()(x).logits - reference_logits(hf, x)).abs().max() < 1e-10
    back = from_llama(hf)
    for key, value in model.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


def test_to_llama_refuses_what_llama_does_not_have():
    for overrides in ({"attention": "local_1d"}, {"norm": "layernorm"}, {"position": {"layout": "pairs"}}):
        model = zoo.create_model("transformer_pp", vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=1, **overrides)
        with pytest.raises(ValueError, match="is not Llama's block"):
            to_llama(model)


def test_from_llama_refuses_what_the_zoo_does_not_model():
    hf = llama()
    hf.config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        from_llama(hf)


def test_a_swapped_mechanism_keeps_every_other_weight():
    hf = llama(2)
    model = from_llama(hf, attention={"name": "local_1d", "block": 16})  # Llama's projections: no bias, 2 kv heads
    assert all(block.attention.registry_name == "local_1d" for block in model.stack.blocks)
    assert model.stack.blocks[0].attention.n_kv_heads == 2 and model.stack.blocks[0].attention.to_q.bias is None
    ours, theirs = model.state_dict(), hf.state_dict()
    gate = theirs["model.layers.1.mlp.gate_proj.weight"]
    assert torch.equal(ours["stack.blocks.1.feed_forward.gate_proj.weight"], gate)
    assert torch.equal(ours["stack.blocks.2.attention.to_k.weight"], theirs["model.layers.2.self_attn.k_proj.weight"])
    x = tokens(12)  # inside one block: local attention sees every earlier key, so it is Llama again
    with torch.no_grad():
        assert (model.eval()(x).logits - reference_logits(hf, x)).abs().max() < 1e-10


# -- each piece broken once: the equality must fail ---------------------------------------------------------
def rmsnorm_with_mean_removed(self, x):
    centred = x - x.mean(-1, keepdim=True)
    return self.weight * centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.options.eps)


BREAKS = {
    "norm": lambda: mock.patch("zoo.norm.rmsnorm.RMSNorm.forward", rmsnorm_with_mean_removed),
    "gate": lambda: mock.patch("zoo.feed_forward.gated.SwiGLU.gate_activation", staticmethod(torch.nn.functional.gelu)),
    "rotary_layout": lambda: mock.patch("zoo.position.rotary.RotaryPosition.rotate", rotate_pairs),
    "gqa_grouping": lambda: mock.patch("zoo.attention.vanilla.F.scaled_dot_product_attention", interleaved_sdpa),
}


def rotate_pairs(self, x, positions):
    """The rotation on (x_2i, x_2i+1) pairs (the paper's layout) where Llama's is on halves."""
    self.options.layout = "pairs"
    try:
        return BREAKS_ORIGINAL_ROTATE(self, x, positions)
    finally:
        self.options.layout = "halves"


def interleaved_sdpa(q, k, v, *, enable_gqa=False, **kwargs):
    """Dense attention where query head i reads key head i mod n_kv_heads (Llama: i // group)."""
    groups = q.shape[1] // k.shape[1]
    k, v = (x.repeat(1, groups, 1, 1) for x in (k, v))
    return SDPA(q, k, v, **kwargs)


SDPA = torch.nn.functional.scaled_dot_product_attention


BREAKS_ORIGINAL_ROTATE = zoo.position.rotary.RotaryPosition.rotate


@pytest.mark.parametrize("piece", BREAKS)
def test_the_equality_fails_when_a_piece_is_changed(piece):
    hf = llama(2)
    model = from_llama(hf).eval()
    x = tokens()
    with BREAKS[piece](), torch.no_grad():
        broken = model(x).logits
    assert (broken - reference_logits(hf, x)).abs().max() > 1e-3
