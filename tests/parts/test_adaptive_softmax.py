"""Adaptive input + adaptive softmax (zoo/models/adaptive_softmax.py) against the full softmax and against
torch.nn.AdaptiveLogSoftmaxWithLoss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo.models.adaptive_softmax import AdaptiveInput, AdaptiveOptions, AdaptiveSoftmax


def small_lm(**overrides):
    """A one-layer LM, d 32, 4 heads (the size every test here uses), with ``overrides``."""
    return zoo.create_model("vanilla_lm", **{"d_model": 32, "n_layers": 1, "n_heads": 4, "d_ff": 64, **overrides})


def test_single_word_tails_equal_the_full_softmax():
    """Every tail cluster holds one word, so its log-probability is its head logit: with the
    cluster rows set to those words' output rows, the adaptive softmax is the full softmax."""
    torch.manual_seed(0)
    vocab, d = 10, 8
    options = AdaptiveOptions(cutoffs=[7, 8, 9], div_val=1)
    head = AdaptiveSoftmax(vocab, d, options)
    full = torch.randn(vocab, d)
    bias = torch.randn(vocab)
    with torch.no_grad():
        head.weights[0].copy_(full[:7])
        head.biases[0].copy_(bias[:7])
        head.cluster_weight.copy_(full[7:])
        head.cluster_bias.copy_(bias[7:])
        for i in range(1, 4):
            head.biases[i].zero_()
    hidden = torch.randn(5, d)
    expected = torch.log_softmax(hidden @ full.T + bias, -1)
    torch.testing.assert_close(head.log_prob(hidden), expected)
    targets = torch.tensor([0, 6, 7, 8, 9])
    torch.testing.assert_close(
        head.nll(hidden, targets), F.cross_entropy(hidden @ full.T + bias, targets, reduction="none")
    )


@pytest.mark.parametrize("div_val", [1, 2])
def test_matches_torch_adaptive_log_softmax(div_val):
    """Untied weights copied into torch's implementation give the same log-probabilities and NLL."""
    torch.manual_seed(1)
    vocab, d, cutoffs = 50, 16, [10, 30]
    options = AdaptiveOptions(cutoffs=cutoffs, div_val=div_val)
    ours = AdaptiveSoftmax(vocab, d, options)
    ref = torch.nn.AdaptiveLogSoftmaxWithLoss(d, vocab, cutoffs, div_value=float(div_val), head_bias=False)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_()
        for b in ours.biases:
            b.zero_()
        ours.cluster_bias.zero_()
        if div_val > 1:
            ours.projections[0].copy_(torch.eye(d))  # torch's head has no projection
        ref.head.weight.copy_(torch.cat([ours.weights[0], ours.cluster_weight]))
        for i, tail in enumerate(ref.tail, start=1):
            projection = ours.projections[i].T if div_val > 1 else torch.eye(d)
            if div_val == 1:  # torch keeps a d x d projection even at div_value 1: make it the identity
                projection = torch.eye(d)
            tail[0].weight.copy_(projection)
            tail[1].weight.copy_(ours.weights[i])
    hidden = torch.randn(12, d)
    targets = torch.randint(0, vocab, (12,))
    torch.testing.assert_close(ours.log_prob(hidden), ref.log_prob(hidden), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(-ours.nll(hidden, targets), ref(hidden, targets).output, rtol=1e-5, atol=1e-5)


def test_log_probs_normalise_and_nll_agrees():
    torch.manual_seed(2)
    options = AdaptiveOptions(cutoffs=[5, 20, 60], div_val=2)
    head = AdaptiveSoftmax(100, 32, options)
    hidden = torch.randn(7, 32)
    logp = head.log_prob(hidden)
    torch.testing.assert_close(logp.logsumexp(-1), torch.zeros(7), atol=1e-5, rtol=0)
    targets = torch.tensor([0, 4, 5, 19, 20, 59, 99])
    torch.testing.assert_close(head.nll(hidden, targets), -logp.gather(1, targets[:, None]).squeeze(1))


def test_lm_with_adaptive_head_ties_weights_and_projections():
    model = small_lm(vocab_size=100, adaptive={"cutoffs": [20, 50], "div_val": 2})
    embed, head = model.embed, model.head
    assert isinstance(embed, AdaptiveInput) and isinstance(head, AdaptiveSoftmax)
    assert all(a is b for a, b in zip(embed.embeddings, head.weights))
    assert head.projections[0] is not embed.projections[0]  # the head cluster's projection is separate
    assert head.projections[1] is embed.projections[1] and head.projections[2] is embed.projections[2]
    widths = [32, 16, 8]
    expected_embed = 20 * 32 + 30 * 16 + 50 * 8 + sum(32 * w for w in widths)
    expected_head = 32 * 32 + 2 * 32 + 2 + 100  # own head projection, cluster rows + biases, word biases
    n_embed_head = sum(p.numel() for p in {id(p): p for p in [*embed.parameters(), *head.parameters()]}.values())
    assert n_embed_head == expected_embed + expected_head


def test_lm_adaptive_equals_full_softmax_lm_with_same_weights():
    """A whole LM: adaptive input/output with single-word tails and div_val 1 is the ordinary LM."""
    torch.manual_seed(3)
    kwargs = dict(vocab_size=12, d_model=16, n_layers=1, n_heads=2, d_ff=32, dropout=0.0, tie_embeddings=False)
    plain = zoo.create_model("vanilla_lm", **kwargs)
    adaptive = zoo.create_model("vanilla_lm", **kwargs, adaptive={"cutoffs": [10, 11]})
    state = {k: v for k, v in plain.state_dict().items() if not k.startswith(("embed.", "head."))}
    adaptive.load_state_dict(state, strict=False)
    emb, out = plain.embed.weight.detach(), plain.head.weight.detach()
    with torch.no_grad():
        adaptive.embed.embeddings[0].copy_(emb[:10])
        adaptive.embed.embeddings[1].copy_(emb[10:11])
        adaptive.embed.embeddings[2].copy_(emb[11:])
        adaptive.head.weights[0].copy_(out[:10])
        adaptive.head.cluster_weight.copy_(out[10:])
    tokens = torch.randint(0, 12, (2, 9))
    targets = torch.randint(0, 12, (2, 9))
    plain.eval(), adaptive.eval()
    a, b = plain(tokens, targets), adaptive(tokens, targets)
    torch.testing.assert_close(b.logits, torch.log_softmax(a.logits, -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-5, atol=1e-5)


def test_training_step_skips_full_log_probs_and_learns():
    torch.manual_seed(4)
    model = small_lm(vocab_size=60, dropout=0.0, adaptive={"cutoffs": [10, 30], "div_val": 2})
    tokens = torch.randint(0, 60, (4, 16))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        out = model(tokens[:, :-1], tokens[:, 1:])
        assert out.logits.shape == (4, 15, 0)  # no [b, t, V] tensor in a training step
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(float(out.loss.detach()))
    assert losses[-1] < 0.5 * losses[0]
    model.eval()
    assert model(tokens).logits.shape == (4, 16, 60)


def test_bad_adaptive_configs_are_refused():
    with pytest.raises(ValueError, match="cutoffs must increase"):
        small_lm(vocab_size=100, adaptive={"cutoffs": [50, 20]})
    with pytest.raises(ValueError, match="inside"):
        small_lm(vocab_size=100, adaptive={"cutoffs": [100]})
    with pytest.raises(ValueError, match="0 wide"):
        small_lm(vocab_size=100, adaptive={"cutoffs": [5, 20, 60], "div_val": 4})
    with pytest.raises(ValueError, match="no key 'cutof'"):
        small_lm(vocab_size=100, adaptive={"cutof": [10]})
    with pytest.raises(ValueError, match="adaptive .* is an LM option"):
        zoo.create_model("vanilla_classifier", vocab_size=100, d_model=32, n_heads=4, adaptive={"cutoffs": [10]})
    with pytest.raises(ValueError, match="cannot be combined with head='none'"):
        small_lm(vocab_size=100, head="none", adaptive={"cutoffs": [10]})
    model = small_lm(vocab_size=100, adaptive={"cutoffs": [10]})
    with pytest.raises(ValueError, match="targets must lie"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.full((1, 4), 100))


def test_every_parameter_gets_a_gradient_even_when_a_cluster_is_empty():
    """Data-parallel training needs every parameter in the graph: a batch with no tail-cluster
    token still reaches the tail weights (with zero gradient)."""
    model = small_lm(vocab_size=60, adaptive={"cutoffs": [10, 30], "div_val": 2})
    tokens = torch.randint(0, 10, (2, 9))  # head-cluster words only
    model(tokens[:, :-1], tokens[:, 1:]).loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    assert not missing
