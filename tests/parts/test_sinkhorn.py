"""``sinkhorn`` against the paper's equations written out (Tay et al. 2020, arXiv:2002.11296, Section 3; no
runnable PyTorch reference of the paper exists): block sums -> R = relu(psi W_P + b_P) -> Sinkhorn balancing
by plain divisions (rows, then columns) -> sorted blocks sum_j S_ij K_j -> each query block attends to its own
block and its sorted block; SortCut (the first c sorted blocks for every query); the causal form (earlier
blocks sort, rows only, local block causal); and balancing converges to a doubly stochastic matrix."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.attention.sinkhorn import sinkhorn

D, H = 32, 4


def written_out(attn, x, causal=False, sortcut=0):
    o = attn.options
    b, t, _ = x.shape
    size, k = o.block, D // H
    n = t // size
    q, key, v = (attn.split_heads(p(x)) for p in (attn.to_q, attn.to_k, attn.to_v))
    psi = x.view(b, n, size, D).sum(2)  # block sums
    if causal:
        psi = torch.stack([psi[:, :i].sum(1) for i in range(n)], dim=1)  # the blocks before i
    r = torch.relu(psi @ attn.sort_net.weight.T + attn.sort_net.bias).view(b, n, H, -1)[..., :n]
    p = torch.exp(r.permute(0, 2, 1, 3) / o.temperature)  # [b, h, n, n]
    if causal:
        p = p * torch.ones(n, n, dtype=torch.bool).tril(-1)
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-300)
    else:
        for _ in range(o.sinkhorn_iterations):
            p = p / p.sum(-1, keepdim=True)
            p = p / p.sum(-2, keepdim=True)
    kb, vb = key.view(b, H, n, size, k), v.view(b, H, n, size, k)
    ks, vs = torch.einsum("bhij,bhjsk->bhisk", p, kb), torch.einsum("bhij,bhjsk->bhisk", p, vb)
    out = torch.zeros(b, H, t, k, dtype=x.dtype)
    for i in range(t):
        blk = i // size
        if sortcut:
            keys, values = ks[:, :, :sortcut].flatten(2, 3), vs[:, :, :sortcut].flatten(2, 3)
        else:
            own = slice(0, i % size + 1) if causal else slice(0, size)
            sorted_part = slice(0, 0) if causal and blk == 0 else slice(0, size)  # no earlier block to sort in
            keys = torch.cat([kb[:, :, blk, own], ks[:, :, blk, sorted_part]], dim=2)
            values = torch.cat([vb[:, :, blk, own], vs[:, :, blk, sorted_part]], dim=2)
        scores = torch.einsum("bhk,bhsk->bhs", q[:, :, i], keys) / k**0.5
        out[:, :, i] = torch.einsum("bhs,bhsk->bhk", torch.softmax(scores, -1), values)
    return attn.to_out(attn.merge_heads(out))


@pytest.mark.parametrize("causal,sortcut", [(False, 0), (True, 0), (False, 2)])
def test_sinkhorn_attention_is_the_papers_equations(causal, sortcut):
    torch.manual_seed(0)
    attn = (
        zoo.create_attention(
            "sinkhorn", d_model=D, n_heads=H, causal=causal, block=4, max_len=32, sinkhorn_iterations=5, sortcut=sortcut
        )
        .double()
        .eval()
    )
    x = torch.randn(2, 24, D, dtype=torch.float64)
    torch.testing.assert_close(attn(x).out, written_out(attn, x, causal, sortcut), rtol=1e-10, atol=1e-10)


def test_balancing_converges_to_a_doubly_stochastic_matrix_and_refusals():
    logits = torch.randn(3, 6, 6, dtype=torch.float64)
    s = sinkhorn(logits, torch.ones(6, 6, dtype=torch.bool), 200)
    torch.testing.assert_close(s.sum(-1), torch.ones(3, 6, dtype=torch.float64))
    torch.testing.assert_close(s.sum(-2), torch.ones(3, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="no causal form"):
        zoo.create_attention("sinkhorn", d_model=D, n_heads=H, causal=True, sortcut=2)
    with pytest.raises(ValueError, match="max_len=16"):
        zoo.create_attention("sinkhorn", d_model=D, n_heads=H, block=4, max_len=16)(torch.randn(1, 17, D))
