"""Caches append in place (zoo/attention/append.py), and states stay values: over every mechanism that
streams (picked by flags), a prefilled state continued twice gives the same as the full pass both times
(and the first continuation, resumed after the second, still does); beams reordered with reorder_state
continue as the rows they picked; the dense cache writes each token once into storage that grows
geometrically rather than being copied per token.
"""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.attention.base import ATTENTION
from zoo.models.base import reorder_state

VOCAB = 24
STREAMING = [n for n in zoo.list_attention() if ATTENTION.get(n).supports_memory and ATTENTION.get(n).supports_causal]


def lm(name: str, **options):
    cls = ATTENTION.get(name)
    torch.manual_seed(0)
    attention = {"name": name, **cls.contract_options(), **options}
    return zoo.create_model(
        "vanilla_lm", vocab_size=VOCAB, d_model=32, n_heads=4, d_ff=48, n_layers=2, attention=attention, dropout=0.0
    ).eval()


def ids(b: int, t: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def continue_by_tokens(model, state, tokens):
    logits = []
    for j in range(tokens.shape[1]):
        out = model(tokens[:, j : j + 1], state=state)
        state = out.state
        logits.append(out.logits)
    return torch.cat(logits, dim=1), state


@pytest.mark.parametrize("name", STREAMING)
@torch.no_grad()
def test_a_prefilled_state_decodes_twice_alike(name):
    model = lm(name)
    if model.stream_refusal() is not None:
        pytest.skip(model.stream_refusal())
    prompt, a, b = ids(2, 9, 0), ids(2, 6, 1), ids(2, 6, 2)
    prefilled = model(prompt, state=model.init_state(2)).state
    first, after_a = continue_by_tokens(model, prefilled, a)
    second, _ = continue_by_tokens(model, prefilled, b)
    resumed, _ = continue_by_tokens(model, after_a, b[:, :3])
    whole_a = model(torch.cat([prompt, a], 1)).logits[:, 9:]
    whole_b = model(torch.cat([prompt, b], 1)).logits[:, 9:]
    whole_ab = model(torch.cat([prompt, a, b[:, :3]], 1)).logits[:, 15:]
    torch.testing.assert_close(first, whole_a, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(second, whole_b, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(resumed, whole_ab, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", STREAMING)
@torch.no_grad()
def test_reordered_beams_continue_as_the_rows_they_picked(name):
    model = lm(name)
    if model.stream_refusal() is not None:
        pytest.skip(model.stream_refusal())
    prompt, more = ids(3, 8, 3), ids(3, 5, 4)
    state = model(prompt, state=model.init_state(3)).state
    _, state = continue_by_tokens(model, state, more[:, :2])  # the storage has a tip past the prefill
    pick = torch.tensor([2, 0, 0])
    beams, _ = continue_by_tokens(model, reorder_state(state, pick), more[pick, 2:])
    whole = model(torch.cat([prompt, more], 1)[pick]).logits[:, 10:]
    torch.testing.assert_close(beams, whole, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_the_dense_cache_is_written_in_place_not_copied_per_token():
    """200 tokens decoded one by one after a 10-token prompt: the keys live in a handful of storages
    (capacity doubles: 64, then 2 x the length when full), not one per token."""
    model = lm("vanilla", max_cache=0)
    out = model(ids(1, 10, 5), state=model.init_state(1))
    storages = set()
    for j in range(200):
        out = model(ids(1, 1, 100 + j), state=out.state)
        storages.add(out.state.layers[0].attention.k.untyped_storage().data_ptr())
    assert out.state.layers[0].attention.length == 210
    assert len(storages) <= 4, f"{len(storages)} storages for 200 tokens: the cache is copied as it grows"


@pytest.mark.parametrize(
    "name, options",
    [
        ("vanilla", {"max_cache": 16}),
        ("local_1d", {"block": 4, "memory": 12}),
        ("adaptive_span", {"max_span": 16, "cache_size": 16}),
    ],
)
@torch.no_grad()
def test_a_rolling_window_evicts_without_copying(name, options):
    """A bounded window (the vanilla cache's max_cache, local attention's pattern cache,
    adaptive span's cache of layer inputs) slides over its
    storage: a new storage only when the old one is full (every ~window tokens), not every token."""
    model = lm(name, **options)
    bound = model.stack.blocks[0].attention.state_bound()
    out = model(ids(1, 10, 5), state=model.init_state(1))
    storages = set()
    for j in range(200):
        out = model(ids(1, 1, 100 + j), state=out.state)
        cache = out.state.layers[0].attention
        storages.add((cache.k if hasattr(cache, "k") else cache.x).untyped_storage().data_ptr())
    assert out.state.layers[0].attention.length == bound
    assert len(storages) <= 200 // bound + 2, f"{len(storages)} storages for 200 tokens of a {bound}-token window"


def test_a_training_segment_gets_gradient_through_its_keys_and_stores_detached_ones():
    """With gradient (a bounded cache carried in training) the segment's own keys carry gradient, the
    cache it returns does not."""
    model = lm("vanilla", max_cache=12).train()
    state = model.init_state(2)
    for seed in range(3):
        out = model(ids(2, 8, seed), targets=ids(2, 8, seed + 10), state=state)
        out.loss.backward()
        state = out.state
        cache = state.layers[0].attention
        assert not cache.k.requires_grad and not cache.v.requires_grad
    assert model.stack.blocks[0].attention.to_k.weight.grad.abs().sum() > 0


@torch.no_grad()
def test_the_lsh_bucket_cache_is_overwritten_in_place():
    """Each decode step overwrites one slot per round of LSH's bounded bucket cache: after the first step
    copies the prefilled cache into its storage, every later step writes into that same storage."""
    model = lm("lsh")
    out = model(ids(1, 10, 5), state=model.init_state(1))
    storages = set()
    for j in range(50):
        out = model(ids(1, 1, 100 + j), state=out.state)
        storages.add(out.state.layers[0].attention.keys.untyped_storage().data_ptr())
    assert len(storages) == 1, f"{len(storages)} storages for 50 tokens: the bucket cache is copied per token"


def first_cache_tensor(state) -> torch.Tensor:
    """The first float tensor of layer 0's cache (keys, or the kept layer inputs)."""
    cache = state.layers[0].attention
    return next(t for t in vars(cache).values() if isinstance(t, torch.Tensor) and t.is_floating_point())


@pytest.mark.parametrize("name", ["vanilla", "local_1d", "adaptive_span", "lsh"])
@torch.no_grad()
def test_decoding_again_once_the_first_continuation_is_gone_equals_one_call(name):
    """A prefilled state decoded from again after its first continuation was dropped: the dense and pattern
    caches take back the positions nobody sees any more and append in place (the dense cache: into the
    prefill's own storage, no copy), LSH copies its prefilled slots into the storage the continuation before
    used; every continuation equals the full pass, and a tensor taken from a continuation (a view of its
    storage) keeps its values while it is held."""
    model = lm(name)
    prompt, a, b, c = ids(2, 9, 0), ids(2, 6, 1), ids(2, 6, 2), ids(2, 6, 3)
    prefilled = model(prompt, state=model.init_state(2)).state
    _, after_a = continue_by_tokens(model, prefilled, a)
    taken = first_cache_tensor(after_a)[..., -3:, :]
    kept = taken.clone()
    del after_a  # only a view taken from it is left: the next continuation must not write into it
    second, after_b = continue_by_tokens(model, prefilled, b)
    torch.testing.assert_close(taken, kept, atol=0, rtol=0)
    storage_b = first_cache_tensor(after_b).untyped_storage().data_ptr()
    del taken, after_b
    third, after_c = continue_by_tokens(model, prefilled, c)  # nothing but the prefilled state is left
    torch.testing.assert_close(second, model(torch.cat([prompt, b], 1)).logits[:, 9:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(third, model(torch.cat([prompt, c], 1)).logits[:, 9:], atol=1e-4, rtol=1e-4)
    storage_c = first_cache_tensor(after_c).untyped_storage().data_ptr()
    if name == "vanilla":
        assert storage_c == first_cache_tensor(prefilled).untyped_storage().data_ptr(), "the prefill was copied"
    if name == "lsh":
        assert storage_c == storage_b, "the bucket cache was copied into new storage, not the unused one"


@torch.no_grad()
def test_an_lsh_state_overwritten_by_a_later_step_is_refused():
    """LSH's bucket cache overwrites its slots in place, so a state continued past is no longer what it was:
    decoding from it again is refused with the reason (it used to continue silently from overwritten slots),
    while the prefilled state and the latest one still continue exactly."""
    model = lm("lsh")
    prompt, a, b = ids(2, 9, 0), ids(2, 6, 1), ids(2, 3, 2)
    prefilled = model(prompt, state=model.init_state(2)).state
    _, middle = continue_by_tokens(model, prefilled, a[:, :3])
    _, latest = continue_by_tokens(model, middle, a[:, 3:])
    with pytest.raises(ValueError, match="overwrote its fixed slots"):
        continue_by_tokens(model, middle, b)
    from_latest, _ = continue_by_tokens(model, latest, b)
    whole = model(torch.cat([prompt, a, b], 1)).logits[:, 15:]
    torch.testing.assert_close(from_latest, whole, atol=1e-4, rtol=1e-4)
