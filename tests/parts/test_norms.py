"""The norm parts against references we did not write (zoo/norm/): ``layernorm`` equals ``nn.LayerNorm``
(and ``F.layer_norm`` without a bias); ``rmsnorm`` equals ``torch.nn.RMSNorm`` in float64 and HF's
``LlamaRMSNorm`` (the ``references`` extra; skipped where absent) in float32 and bfloat16, where both
compute in float32 and cast back. In float64 LlamaRMSNorm casts to float32 (ours keeps float64), so
there the two agree to float32 precision only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo.norm import create_norm

D = 24


def randomised(module: nn.Module, dtype=torch.float64) -> nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(1.0 + 0.5 * torch.randn_like(p))
    return module.to(dtype)


def test_layernorm_equals_torch_layernorm_with_and_without_bias():
    x = torch.randn(2, 5, D, dtype=torch.float64)
    ours, reference = randomised(create_norm("layernorm", D)), nn.LayerNorm(D).double()
    reference.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(x), reference(x), atol=1e-12, rtol=1e-12)
    plain = randomised(create_norm({"name": "layernorm", "bias": False, "eps": 1e-3}, D))
    assert [name for name, _ in plain.named_parameters()] == ["weight"]
    torch.testing.assert_close(plain(x), F.layer_norm(x, (D,), plain.weight, None, 1e-3), atol=1e-12, rtol=1e-12)


def test_rmsnorm_equals_torch_rmsnorm_in_float64():
    x = 3.0 * torch.randn(2, 5, D, dtype=torch.float64)
    ours = randomised(create_norm({"name": "rmsnorm", "eps": 1e-5}, D))
    reference = nn.RMSNorm(D, eps=1e-5).double()
    reference.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(x), reference(x), atol=1e-12, rtol=1e-12)
    assert not torch.allclose(ours(x), F.layer_norm(x, (D,), ours.weight, None, 1e-5))  # no mean subtracted


def llama_rmsnorm(eps: float):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    assert transformers  # imported for the skip
    return LlamaRMSNorm(D, eps=eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rmsnorm_equals_hf_llama_rmsnorm(dtype):
    reference = llama_rmsnorm(1e-6)
    ours = randomised(create_norm("rmsnorm", D), dtype)
    reference.load_state_dict(ours.state_dict())
    reference.to(dtype)
    x = (4.0 * torch.randn(3, 7, D)).to(dtype)
    ours_out, reference_out = ours(x), reference(x)
    assert ours_out.dtype == reference_out.dtype == dtype
    if dtype == torch.float64:  # LlamaRMSNorm computes in float32 even here
        torch.testing.assert_close(ours_out, reference_out, atol=1e-6, rtol=1e-6)
    else:  # the same float32 computation, cast back the same way: equal
        torch.testing.assert_close(ours_out, reference_out, atol=0, rtol=0)
