"""What every registered part answers about itself, and that the answers are true.

Consumers (describe, the benchmark's FLOP model, the LRA tables, the data checks, the evaluation
protocols, the aux losses, decoding) ask the parts instead of switching on registry names, so each
answer is checked against what the part does, over the registries (a new part is checked the moment
it registers; one that does not answer says None):

- attention: ``keys_per_query`` equals the keys a query's output depends on (measured by gradient,
  one head, no memory; an upper bound is never exceeded); ``forward_flops`` follows from it unless
  the mechanism counts its own; ``evaluation_memory`` sets and restores, or refuses naming itself;
- stack: ``layer_blocks`` are the blocks whose outputs are the layers' outputs, in order;
  ``block_applications`` and ``kept_layers`` agree with the stack's depth;
- position: ``length_limit`` is where the signal refuses a longer sequence;
- task: ``nominal_vocab_size`` needs no file.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import zoo
from zoo.attention.base import ATTENTION, FlopCount, KeysPerQuery
from zoo.data import TASK
from zoo.models import costs
from zoo.position.base import POSITION
from zoo.presets.factory import TINY
from zoo.stacks.base import STACK

D, H = 32, 4
T = 96  # long beside every contract pattern (blocks, strides, chunks of 4-8), short enough for a second
NAMES = zoo.list_attention()
CASES = [
    (n, c)
    for n in NAMES
    for c in (
        [True] if ATTENTION.get(n).causal_only else [False, True] if ATTENTION.get(n).supports_causal else [False]
    )
]
IDS = [f"{n}-{'causal' if c else 'bidir'}" for n, c in CASES]


def build(name: str, causal: bool, n_heads: int = H, **extra):
    cls = ATTENTION.get(name)
    options = {**cls.contract_options(), **extra}
    return zoo.create_attention(name, d_model=D, n_heads=n_heads, causal=causal, **options).eval()


def measured_keys(attn, t: int) -> torch.Tensor:
    """[t]: how many positions each query's output depends on (its keys, and itself through its query):
    row p of a batch of identical rows backpropagates from query p only."""
    x = torch.randn(1, t, D).expand(t, t, D).clone().requires_grad_(True)
    out = attn(x).out
    out[torch.arange(t), torch.arange(t)].sum().backward()
    return (x.grad.abs().sum(-1) > 0).sum(-1).double()


@pytest.mark.parametrize("name,causal", CASES, ids=IDS)
def test_every_attention_answers_or_says_unknown(name, causal):
    attn = build(name, causal)
    keys, flops, memory = attn.keys_per_query(T), attn.forward_flops(T), attn.memory_keys()
    assert keys is None or (isinstance(keys, KeysPerQuery) and keys.keys > 0 and keys.rule)
    assert memory is None or (isinstance(memory, int) and memory >= 0)
    assert flops is None or (isinstance(flops, FlopCount) and flops.total > 0)
    if keys is not None:  # a mechanism that says what it sees can be costed
        assert flops is not None
        assert keys.keys <= (memory or 0) + ((T + 1) / 2 if causal else T) + 1e-9  # never more than exist
    assert attn.projection_flops() > 0
    assert ATTENTION.get(name).lra_row is None or isinstance(ATTENTION.get(name).lra_row, str)
    option = ATTENTION.get(name).memory_option
    assert option is None or option in {f.name for f in dataclasses.fields(attn.options)}


@pytest.mark.parametrize("name,causal", CASES, ids=IDS)
def test_keys_per_query_is_what_a_query_reaches(name, causal):
    """One head (each head of a content-routed mechanism has its own buckets) over a segment with no
    memory: the measured count equals the answer less the memory keys (within 15%: the first blocks
    see fewer), or stays below an upper bound (+1: the query itself)."""
    try:
        attn = build(name, causal, n_heads=1)
    except ValueError:  # a mechanism that needs several heads is measured with them
        attn = build(name, causal)
    answer = attn.keys_per_query(T)
    if answer is None:
        pytest.skip(f"{name} does not say how many keys a query sees")
    reached = float(measured_keys(attn, T).mean())
    in_segment = answer.keys - attn.memory_keys()
    if answer.upper_bound:
        assert reached <= answer.keys + 1
    else:
        assert reached == pytest.approx(in_segment, rel=0.15), answer.rule


@pytest.mark.parametrize(
    "name", [n for n in NAMES if "combine" in {f.name for f in dataclasses.fields(ATTENTION.get(n).Options)}]
)
def test_interleaved_patterns_answer_per_layer(name):
    for layer in (0, 1):
        attn = build(name, True, n_heads=1, combine="interleaved", layer_index=layer)
        assert float(measured_keys(attn, T).mean()) == pytest.approx(attn.keys_per_query(T).keys, rel=0.15)


@pytest.mark.parametrize("name,causal", CASES, ids=IDS)
def test_forward_flops_follow_the_keys_unless_the_mechanism_counts_its_own(name, causal):
    attn = build(name, causal)
    keys, flops = attn.keys_per_query(T), attn.forward_flops(T)
    if keys is None or set(flops.forward) != {"projections", "attention"}:
        pytest.skip(f"{name} counts its own FLOPs (or none)")
    assert flops.forward["attention"] == pytest.approx(2 * T * attn.score_terms * D * keys.keys)
    assert flops.forward["projections"] == pytest.approx(T * attn.projection_flops())
    assert not flops.no_backward


@pytest.mark.parametrize("name", NAMES)
def test_evaluation_memory_is_set_and_restored_or_refused(name):
    attn = build(name, ATTENTION.get(name).supports_causal)
    before = dataclasses.asdict(attn.options)
    with attn.evaluation_memory(0, 0) as changed:  # nothing asked: every mechanism accepts
        assert changed is False
    try:
        with attn.evaluation_memory(mem_len=7, clamp_len=3) as changed:
            assert changed is True
            assert dataclasses.asdict(attn.options) != before  # the settings reached the mechanism
    except ValueError as exc:
        assert name in str(exc)  # refused, naming itself
    assert dataclasses.asdict(attn.options) == before


# -- stacks ---------------------------------------------------------------------------------------


def stack_cases():
    return [(n, v) for n in STACK.list() for v in STACK.get(n).contract_variants()]


def tiny_model(stack: str, options: dict, **extra):
    config = {**TINY, "stack": {"name": stack, **options}, "residual": "pre_norm", **extra}
    if STACK.get(stack).adds_position_signal(options):
        config["position"] = "none"
    if STACK.get(stack).needs_additive or not STACK.get(stack).keeps_state:
        config["attention"] = "shared_qk"  # stateless: what every stack can hold
    return zoo.create_model("vanilla_lm", **config)


@pytest.mark.parametrize("name,options", stack_cases(), ids=[f"{n}-{i}" for i, (n, _) in enumerate(stack_cases())])
def test_every_stack_answers_and_its_layer_blocks_are_the_layers(name, options):
    torch.manual_seed(0)
    model = tiny_model(name, options).eval()
    stack = model.stack
    applied, kept, recompute = stack.block_applications(), stack.kept_layers(), stack.recompute_passes()
    assert applied is None or len(applied) >= 1
    assert kept is None or 1 <= kept <= max(len(applied or []), stack.n_layers)
    assert recompute is None or recompute >= 0
    blocks = stack.layer_blocks()
    if blocks is None:
        return
    seen = []
    hooks = [b.register_forward_hook(lambda module, args, out: seen.append((module, out.x))) for b in blocks]
    try:
        out = stack(torch.randn(2, 8, TINY["d_model"]))
    finally:
        for hook in hooks:
            hook.remove()
    assert [module for module, _ in seen] == list(blocks)  # each block once, in order
    torch.testing.assert_close(seen[-1][1], out.x)  # the last layer's output is the stack's


@pytest.mark.parametrize("name,options", stack_cases(), ids=[f"{n}-{i}" for i, (n, _) in enumerate(stack_cases())])
def test_step_flops_add_up_over_the_layers_the_stack_applies(name, options):
    model = tiny_model(name, options)
    flops = costs.step_flops(model, 16)
    if flops is None:
        assert costs.unanswered(model, 16)  # unknown names who is silent
        return
    assert flops["total"] == pytest.approx(sum(v for k, v in flops.items() if k != "total"))
    per_block = [
        b.attention.forward_flops(16).total + b.feed_forward.forward_flops(16) for b in model.stack.block_applications()
    ]
    factor = 3 + model.stack.recompute_passes()
    assert flops["total"] == pytest.approx(factor * sum(per_block) + flops["output_layer"], rel=1e-6)


# -- positions and tasks ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", POSITION.list())
def test_length_limit_is_where_the_signal_refuses(name):
    cls = POSITION.get(name)
    position = cls(16, 12, **cls.contract_options()).eval()
    limit = position.length_limit()
    assert limit is None or isinstance(limit, int)
    position(torch.randn(1, limit or 40, 16))  # up to the limit: fine
    if limit is not None:
        with pytest.raises(ValueError):
            position(torch.randn(1, limit + 1, 16))


@pytest.mark.parametrize("name", TASK.list())
def test_every_task_names_its_vocabulary_without_data(name):
    size, source = TASK.get(name).nominal_vocab_size({})
    assert isinstance(size, int) and size > 1 and source


@pytest.mark.parametrize("preset", zoo.list_models())
def test_every_preset_is_costed_or_names_the_silent_part(preset):
    """describe's figures for every preset: known, or unknown with the part that does not say named."""
    tiny = zoo.presets.get_preset(preset).tiny
    with torch.device("meta"):
        model = zoo.create_model(preset, **tiny)
    t = zoo.presets.get_preset(preset).example_length
    info = costs.describe_costs(model, t)
    silent = costs.unanswered(model, t)
    assert (info["train_flops_per_token"] is None) == bool(silent), silent
    if info["train_flops_per_token"] is not None:
        assert info["train_flops_per_token"] >= 3 * info["forward_flops_per_token"] * (1 - 1e-9) > 0
        assert info["keys_per_query"] > 0 and info["activation_bytes_per_token"] > 0
    else:
        assert all(info[k] is None for k in ("train_flops_per_token", "forward_flops_per_token"))
        assert info["keys_rule"].startswith("unknown: ") or info["head_rule"].startswith("unknown: ")
