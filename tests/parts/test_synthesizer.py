"""``synthesizer`` against the paper's equations written out (Tay et al. 2020, arXiv:2005.00743, eqs. 1-6;
no runnable reference exists in PyTorch): each synthesis, causal and padded, the mixture with dot-product
attention, and the properties that define them (a random synthesizer's weights ignore the input; a
fixed random one is not trained; a sequence longer than l is refused)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import zoo

D, H, L = 32, 4, 24


def build(**options):
    torch.manual_seed(0)
    return zoo.create_attention("synthesizer", d_model=D, n_heads=H, max_len=L, **options).double().eval()


def written_out(attn, x, allowed):
    """softmax(B) G(X) per head, B written out from the weights as the paper defines it, token by token."""
    o, (b, t, _) = attn.options, x.shape
    k = D // H
    g = attn.to_v(x).view(b, t, H, k)
    out = torch.zeros(b, t, H, k, dtype=x.dtype)
    for head in range(H):
        for i in range(t):
            if o.synthesis == "dense":  # eq. 1: B_i = W_2 relu(W_1 x_i + b_1) + b_2
                hidden = F.relu(x[:, i] @ attn.hidden.weight.T + attn.hidden.bias)
                row = hidden @ attn.rows.weight[head * L : (head + 1) * L].T + attn.rows.bias[head * L : (head + 1) * L]
            elif o.synthesis == "factorized_dense":  # eq. 5: C_i[j] = A_i[j mod a] * B_i[j div a]
                a_n, b_n = o.factors, L // o.factors
                hidden = F.relu(x[:, i] @ attn.hidden.weight.T + attn.hidden.bias)
                a = (
                    hidden @ attn.rows_a.weight[head * a_n : (head + 1) * a_n].T
                    + attn.rows_a.bias[head * a_n : (head + 1) * a_n]
                )
                bb = (
                    hidden @ attn.rows_b.weight[head * b_n : (head + 1) * b_n].T
                    + attn.rows_b.bias[head * b_n : (head + 1) * b_n]
                )
                row = torch.stack([a[:, j % a_n] * bb[:, j // a_n] for j in range(L)], dim=-1)
            elif o.synthesis == "random":  # eq. 3: B = R
                row = attn.random[head, i].expand(b, -1)
            else:  # eq. 6: R = R_1 R_2^T
                row = (attn.random_2[head] @ attn.random_1[head, i]).expand(b, -1)
            row = row[:, :t]
            if o.mix == "dot":
                weights = torch.softmax(attn.mix_logits[head], -1)
                q = (x[:, i] @ attn.to_q.weight.T + attn.to_q.bias).view(b, H, k)[:, head]
                keys = (x @ attn.to_k.weight.T + attn.to_k.bias).view(b, t, H, k)[:, :, head]
                row = weights[0] * row + weights[1] * torch.einsum("bk,btk->bt", q, keys) / k**0.5
            probs = torch.softmax(row.masked_fill(~allowed[:, i], float("-inf")), -1)
            out[:, i, head] = torch.einsum("bt,btk->bk", probs, g[:, :, head])
    return attn.to_out(out.reshape(b, t, D))


@pytest.mark.parametrize("synthesis", ["dense", "random", "factorized_dense", "factorized_random"])
@pytest.mark.parametrize("mix", ["none", "dot"])
def test_each_synthesis_is_the_papers_equation(synthesis, mix):
    for causal in (False, True):
        attn = build(synthesis=synthesis, mix=mix, factors=4)
        attn.causal = causal
        x = torch.randn(2, 13, D, dtype=torch.float64)
        pad = torch.ones(2, 13, dtype=torch.bool)
        pad[1, 10:] = False
        allowed = pad[:, None, :].expand(-1, 13, -1).clone()
        if causal:
            allowed &= torch.ones(13, 13, dtype=torch.bool).tril()
        expected = written_out(attn, x, allowed)
        torch.testing.assert_close(attn(x, pad_mask=pad).out[pad], expected[pad], rtol=1e-10, atol=1e-10)


def test_random_weights_ignore_the_input_and_fixed_random_is_not_trained():
    attn = build(synthesis="random", fixed_random=True)
    x = torch.randn(1, 9, D, dtype=torch.float64)
    with torch.no_grad():  # the scores (so the attention weights) are the same whatever the input
        assert torch.equal(attn.synthesized(x), attn.synthesized(torch.randn_like(x)))
    dense = build(synthesis="dense")
    with torch.no_grad():
        assert not torch.equal(dense.synthesized(x), dense.synthesized(torch.randn_like(x)))
    assert [n for n, p in attn.named_parameters() if not p.requires_grad] == ["random"]
    with pytest.raises(ValueError, match="max_len=24"):
        attn(torch.randn(1, 25, D, dtype=torch.float64))
    with pytest.raises(ValueError, match="fixed_random"):
        zoo.create_attention("synthesizer", d_model=D, n_heads=H, fixed_random=True)


def test_positions_inside_the_synthesizer():
    """A pair bias joins every score (here the random synthesizer's learned R: softmax(R + b(i - j)) V);
    rope rotates the mix='dot' term's q and k, and is refused without it, saying there is no q.k to rotate."""
    torch.manual_seed(5)
    position = zoo.position.base.POSITION.get("alibi")(32, 64, n_heads=4).double()
    attn = zoo.create_attention(
        "synthesizer", d_model=32, n_heads=4, causal=True, synthesis="random", max_len=24, position=position
    ).double()
    x = torch.randn(2, 20, 32, dtype=torch.float64)
    i = torch.arange(20)
    scores = attn.random[:, :20, :20] + position.bias(i[:, None] - i[None, :], causal=True)
    weights = torch.softmax(scores.masked_fill(i[None, :] > i[:, None], float("-inf")), dim=-1)
    expected = attn.to_out(attn.merge_heads(weights @ attn.split_heads(attn.to_v(x))))
    torch.testing.assert_close(attn(x).out, expected, rtol=1e-10, atol=1e-10)
    rope = zoo.position.base.POSITION.get("rope")(32, 64, n_heads=4)
    with pytest.raises(ValueError, match="forms no query-key dot product.*mix='dot' adds Q K"):
        zoo.create_attention("synthesizer", d_model=32, n_heads=4, max_len=24, position=rope)
    zoo.create_attention("synthesizer", d_model=32, n_heads=4, max_len=24, mix="dot", position=rope)
