"""``linformer`` against mlpen/Nystromformer LRA/code/attention_linformer.py @ 56893131 (float64, their E
copied into ours: per-head E shared by keys and values, so ours with sharing=none and F = E), padding
included; a shorter sequence equals the same one padded to max_len; the paper's sharing options hold the
parameters they say; longer than max_len is refused."""

from __future__ import annotations

import pytest
import torch

import zoo
from tests.parts.references import mlpen_module

D, H = 32, 4


def test_linformer_equals_mlpen_lra_linformer():
    module = mlpen_module("attention_linformer")
    module.LinformerAttention.projection_matrix = None  # theirs keeps one E per process (a class attribute)
    torch.manual_seed(0)
    n, k = 48, 12
    ref = module.LinformerAttention({"num_head": H, "head_dim": D // H, "linformer_k": k, "max_seq_len": n}).double()
    attn = zoo.create_attention("linformer", d_model=D, n_heads=H, k=k, max_len=n, sharing="none").double().eval()
    with torch.no_grad():
        attn.project_k.copy_(ref.E)
        attn.project_v.copy_(ref.E)
    x = torch.randn(2, n, D, dtype=torch.float64)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, 30:] = False
    q, kk, v = (attn.split_heads(p(x)) for p in (attn.to_q, attn.to_k, attn.to_v))
    expected = attn.to_out(attn.merge_heads(ref(q, kk, v, mask.double())))
    torch.testing.assert_close(attn(x, pad_mask=mask).out[mask], expected[mask], rtol=1e-10, atol=1e-10)


def test_a_shorter_sequence_is_the_same_sequence_padded_to_max_len():
    torch.manual_seed(1)
    attn = zoo.create_attention("linformer", d_model=D, n_heads=H, k=6, max_len=40).double().eval()
    x = torch.randn(2, 25, D, dtype=torch.float64)
    padded = torch.cat([x, torch.randn(2, 15, D, dtype=torch.float64)], dim=1)
    mask = torch.arange(40)[None].expand(2, -1) < 25
    torch.testing.assert_close(attn(x).out, attn(padded, pad_mask=mask).out[:, :25], rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="max_len=40"):
        attn(torch.randn(1, 41, D, dtype=torch.float64))


def test_sharing_options_hold_the_parameters_the_paper_names():
    def projections(sharing, layers=1):
        model = zoo.create_model(
            "vanilla_classifier",
            vocab_size=16,
            n_classes=2,
            d_model=D,
            n_heads=H,
            n_layers=layers,
            attention={"name": "linformer", "k": 4, "max_len": 16, "sharing": sharing},
        )
        return [(name, p.shape) for name, p in model.named_parameters() if "project_" in name], model.num_parameters

    assert projections("none")[0] == [
        ("stack.blocks.0.attention.project_k", (H, 4, 16)),
        ("stack.blocks.0.attention.project_v", (H, 4, 16)),
    ]
    assert [s for _, s in projections("headwise")[0]] == [(1, 4, 16), (1, 4, 16)]
    assert [s for _, s in projections("kv")[0]] == [(1, 4, 16)]
    layerwise, total = projections("layerwise", layers=3)
    assert [s for _, s in layerwise] == [(1, 4, 16)]  # named_parameters lists a tied tensor once
    assert total == projections("kv", layers=3)[1] - 2 * 4 * 16


def test_max_len_left_zero_is_the_models_and_alone_it_must_be_given():
    """length_option: the stack builder sizes E by the model's max_len (the app raises it to the task's
    length); a value set is kept; built on its own, max_len=0 is refused with the reason."""
    common = dict(vocab_size=16, n_classes=2, d_model=D, n_heads=H, n_layers=1, max_len=40)
    model = zoo.create_model("vanilla_classifier", **common, attention={"name": "linformer", "k": 4})
    assert model.stack.blocks[0].attention.options.max_len == 40
    model = zoo.create_model("vanilla_classifier", **common, attention={"name": "linformer", "k": 4, "max_len": 24})
    assert model.stack.blocks[0].attention.options.max_len == 24
    with pytest.raises(ValueError, match="max_len=0 means the model's max_len"):
        zoo.create_attention("linformer", d_model=D, n_heads=H)
