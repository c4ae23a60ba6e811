"""Bad inputs end in a clear error, never in NaN or a deep torch traceback.

Every case asserts three things: the error is a ValueError/TypeError (our ArgumentTypeError is
both), its message names the argument or key at fault, and it is raised by zoo's own code (the
innermost frame of the traceback lies in zoo/, not in torch or numpy). The policy these tests pin
down (zoo/models/inputs.py): an empty batch or sequence is refused; a well-formed batch whose every target
is ignored has loss 0 (differentiable) and ``stats["scored"] == 0``, never NaN.
"""

from __future__ import annotations

import dataclasses
import math
import traceback
from pathlib import Path

import pytest
import torch

import zoo
from zoo.attention.base import ATTENTION
from zoo.config import ArgumentTypeError, ModelConfig, field_types
from zoo.data import create_task
from zoo.position.base import POSITION
from zoo.presets.factory import get_preset
from zoo.residual.base import RESIDUAL
from zoo.stacks.base import STACK

# token-sequence heads; the two-tower pair classifier reads [b, 2, t] pairs and has its own tests (test_lra.py)
PRESETS = [name for name in zoo.list_models() if zoo.preset_config(name).kind in ("lm", "classifier", "seq2seq")]
LM_PRESETS = [name for name in PRESETS if zoo.preset_config(name).kind == "lm"]
MECHANISMS = zoo.list_attention()
ZOO_DIR = Path(zoo.__file__).resolve().parent


def clear_error(fn, *names: str) -> BaseException:
    """Run ``fn``; it must raise ValueError/TypeError from zoo's own code naming one of ``names``."""
    with pytest.raises((ValueError, TypeError)) as info:
        fn()
    message = str(info.value)
    assert any(name in message for name in names), f"message does not name any of {names}: {message}"
    innermost = Path(traceback.extract_tb(info.value.__traceback__)[-1].filename).resolve()
    assert ZOO_DIR in innermost.parents, f"raised inside {innermost}, not by zoo's checks: {message}"
    return info.value


def tiny(name: str, **overrides):
    preset = get_preset(name)
    return zoo.create_model(name, **zoo.config.merge_config(preset.tiny, overrides)).eval()


def ids(b: int, t: int, vocab: int = 32) -> torch.Tensor:
    return torch.randint(3, vocab, (b, t))


def call(model, tokens, targets=None, **kwargs):
    """Call any head with one token tensor (seq2seq: the same tokens as source and target)."""
    if model.config.kind == "seq2seq":
        return model(tokens, tokens, targets, **kwargs)
    return model(tokens, targets, **kwargs)


def lm_targets(model, b: int, t: int) -> torch.Tensor:
    if model.config.kind == "classifier":
        return torch.randint(0, model.config.n_classes, (b,))
    return ids(b, t)


# -- the cases listed in the issue ---------------------------------------------------------------


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("shape", [(2, 0), (0, 8)], ids=["length0", "batch0"])
def test_empty_sequence_or_batch_is_refused(name, shape):
    model = tiny(name)
    clear_error(
        lambda: call(model, torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.long)), "empty"
    )


@pytest.mark.parametrize("name", [n for n in PRESETS if zoo.preset_config(n).kind != "classifier"])
@pytest.mark.parametrize("how", ["ignore_index", "pad_mask"])
def test_all_padding_targets_give_zero_loss_and_say_nothing_was_scored(name, how):
    model = tiny(name).train()
    tokens = ids(2, 8)
    targets = torch.full_like(tokens, -100) if how == "ignore_index" else ids(2, 8)
    masks = {}
    if how == "pad_mask":
        mask = torch.zeros(2, 8, dtype=torch.bool)
        masks = {"tgt_pad_mask": mask} if model.config.kind == "seq2seq" else {"pad_mask": mask}
    out = call(model, tokens, targets, **masks)
    assert out.loss is not None and torch.isfinite(out.loss) and float(out.loss.detach()) == 0.0
    assert int(out.stats["scored"]) == 0
    out.loss.backward()  # zero loss is still attached to the graph: zero, finite gradients
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() and not g.any() for g in grads)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_scored_stat_counts_real_targets_and_loss_is_the_mean_over_them(smoothing):
    model = tiny("vanilla_lm", label_smoothing=smoothing)
    tokens, targets = ids(2, 6), ids(2, 6)
    targets[0, :4] = -100
    out = model(tokens, targets)
    assert int(out.stats["scored"]) == 8
    logits = out.logits.flatten(0, 1)
    expected = torch.nn.functional.cross_entropy(
        logits, targets.flatten(), ignore_index=-100, label_smoothing=smoothing
    )
    torch.testing.assert_close(out.loss, expected)


def test_classifier_on_length_zero_is_refused_not_nan():
    model = tiny("vanilla_classifier")
    clear_error(lambda: model(torch.zeros(2, 0, dtype=torch.long)), "tokens", "empty")


@pytest.mark.parametrize("n_classes", [0, 1, -2])
def test_classifier_needs_two_classes(n_classes):
    clear_error(lambda: tiny("vanilla_classifier", n_classes=n_classes), "n_classes")


@pytest.mark.parametrize("name", PRESETS)
def test_float_targets_are_refused_not_truncated(name):
    model = tiny(name)
    targets = lm_targets(model, 2, 8).float() + 0.7
    clear_error(lambda: call(model, ids(2, 8), targets), "targets")


@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize("causal", ["no", 1, None, "True"])
def test_causal_flag_must_be_a_bool(name, causal):
    clear_error(
        lambda: zoo.create_attention(
            name, d_model=32, n_heads=4, causal=causal, **ATTENTION.get(name).contract_options()
        ),
        "causal",
    )


def test_n_hashes_true_is_not_one():
    clear_error(lambda: tiny("reformer", attention={"n_hashes": True}), "n_hashes")


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("max_len", [-1, 0])
def test_max_len_must_be_positive(name, max_len):
    clear_error(lambda: tiny(name, max_len=max_len), "max_len")


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("bad", [-1, 32, 10_000])
def test_target_ids_outside_the_vocabulary_are_refused(name, bad):
    model = tiny(name)
    targets = lm_targets(model, 2, 8)
    if model.config.kind == "classifier":  # outside [0, n_classes)
        targets[0] = bad if bad < 0 else model.config.n_classes
    else:  # outside [0, vocab_size) and not the ignore index
        targets[0] = bad
    clear_error(lambda: call(model, ids(2, 8), targets), "targets")


@pytest.mark.parametrize("name", MECHANISMS)
def test_float64_input_to_a_float32_attention_is_refused(name):
    cls = ATTENTION.get(name)
    attn = zoo.create_attention(name, d_model=32, n_heads=4, causal=cls.causal_only, **cls.contract_options())
    clear_error(lambda: attn(torch.randn(2, 8, 32, dtype=torch.float64)), "dtype")


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bool])
def test_float_or_bool_tokens_are_refused(name, dtype):
    model = tiny(name)
    clear_error(lambda: call(model, ids(2, 8).to(dtype)), "tokens", "src", "tgt")


@pytest.mark.parametrize("name", LM_PRESETS)
@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"top_k": -3}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"max_new_tokens": 2.0}, "max_new_tokens"),
        ({"greedy": "yes"}, "greedy"),
        ({"generator": 0}, "generator"),
    ],
)
def test_generate_arguments(name, kwargs, key):
    model = tiny(name)
    args = {"max_new_tokens": 2, **kwargs}
    clear_error(lambda: model.generate(ids(1, 4), **args), key)


@pytest.mark.parametrize("name", LM_PRESETS)
@pytest.mark.parametrize(
    "prompt",
    [
        torch.zeros(1, 0, dtype=torch.long),
        torch.zeros(0, 3, dtype=torch.long),
        torch.ones(1, 3),
        [[1, 2]],
        torch.full((1, 3), 99),
    ],
)
def test_generate_refuses_a_bad_or_empty_prompt(name, prompt):
    model = tiny(name)
    clear_error(lambda: model.generate(prompt, 2), "prompt")


@pytest.mark.parametrize("name", [n for n in PRESETS if zoo.preset_config(n).kind == "seq2seq"])
def test_seq2seq_batch_size_mismatch_names_src_and_tgt(name):
    model = tiny(name)
    error = clear_error(lambda: model(ids(2, 6), ids(3, 5)), "src")
    assert "tgt" in str(error)


@pytest.mark.parametrize("kind", ["classifier", "seq2seq"])
@pytest.mark.parametrize("name", [n for n in MECHANISMS if ATTENTION.get(n).causal_only])
def test_causal_only_mechanism_is_refused_by_every_encoder(kind, name):
    clear_error(
        lambda: zoo.create_model(f"vanilla_{kind}", attention=name, **get_preset("vanilla_lm").tiny), "causal-only"
    )


# -- the battery: every preset, every mechanism, every option ------------------------------------


def bad_calls(model) -> list[tuple[str, object, tuple[str, ...]]]:
    """(label, thunk, names the message may use) for one tiny model."""
    kind, b, t = model.config.kind, 2, 8
    tokens = ids(b, t)
    cases = [
        ("tokens list", lambda: call(model, tokens.tolist()), ("tokens", "src", "tgt")),
        ("tokens 1d", lambda: call(model, tokens[0]), ("tokens", "src", "tgt")),
        ("tokens 3d", lambda: call(model, tokens[..., None]), ("tokens", "src", "tgt")),
        ("tokens negative", lambda: call(model, tokens - 10), ("tokens", "src", "tgt")),
        ("tokens past vocab", lambda: call(model, tokens + 1000), ("tokens", "src", "tgt")),
        (
            "targets wrong shape",
            lambda: call(
                model,
                tokens,
                lm_targets(model, b, t + 1)[:, :-2] if kind != "classifier" else torch.zeros(b + 1, dtype=torch.long),
            ),
            ("targets",),
        ),
        ("targets bool", lambda: call(model, tokens, lm_targets(model, b, t) > 0), ("targets",)),
    ]
    embeds_name = "tgt_embeds" if kind == "seq2seq" else "embeds"
    source = {"src": tokens} if kind == "seq2seq" else {}
    vectors = torch.randn(b, t, model.config.d_model)
    for label, embeds in [
        ("embeds empty", vectors[:, :0]),
        ("embeds no batch", vectors[:0]),
        ("embeds width", vectors[..., :-1]),
        ("embeds int", vectors.long()),
        ("embeds float64", vectors.double()),
    ]:
        cases.append((label, lambda embeds=embeds: model(**source, **{embeds_name: embeds}), (embeds_name,)))
    both = {"tgt": tokens} if kind == "seq2seq" else {"tokens": tokens}
    cases.append(("tokens and embeds", lambda: model(**source, **both, **{embeds_name: vectors}), (embeds_name,)))
    mask_name = {"lm": "pad_mask", "classifier": "pad_mask", "seq2seq": "tgt_pad_mask"}[kind]
    for label, mask in [
        ("pad_mask int", torch.ones(b, t, dtype=torch.long)),
        ("pad_mask short", torch.ones(b, t - 1, dtype=torch.bool)),
        ("pad_mask list", [[True] * t] * b),
        ("pad_mask transposed", torch.ones(t, b, dtype=torch.bool)),
    ]:
        cases.append((label, lambda mask=mask: call(model, tokens, **{mask_name: mask}), (mask_name,)))
    if kind == "seq2seq":
        cases += [
            (
                "src_pad_mask wrong",
                lambda: model(tokens, tokens, src_pad_mask=torch.ones(b, t + 1, dtype=torch.bool)),
                ("src_pad_mask",),
            ),
            ("src empty", lambda: model(ids(b, 0), tokens), ("src",)),
            ("tgt empty", lambda: model(tokens, ids(b, 0)), ("tgt",)),
            ("beam_size 0", lambda: model.generate(tokens, max_len=3, beam_size=0), ("beam_size",)),
            ("beam_size float", lambda: model.generate(tokens, max_len=3, beam_size=2.0), ("beam_size",)),
            ("beam_size bool", lambda: model.generate(tokens, max_len=3, beam_size=True), ("beam_size",)),
            ("max_len 0", lambda: model.generate(tokens, max_len=0), ("max_len",)),
            ("max_len float", lambda: model.generate(tokens, max_len=2.5), ("max_len",)),
            (
                "length_penalty str",
                lambda: model.generate(tokens, max_len=2, length_penalty="0.6"),
                ("length_penalty",),
            ),
            ("generate src float", lambda: model.generate(tokens.float(), max_len=2), ("src",)),
            (
                "generate src_pad_mask",
                lambda: model.generate(tokens, max_len=2, src_pad_mask=torch.ones(b, 1, dtype=torch.bool)),
                ("src_pad_mask",),
            ),
            ("state not a state", lambda: model(None, tokens, state={"layers": []}), ("state",)),
        ]
    if kind == "classifier":
        cases.append(("classifier state", lambda: model(tokens, state=[]), ("state",)))
    if kind == "lm":
        other = tiny("vanilla_lm" if model.config.name != "vanilla_lm" else "transformer_xl")
        cases += [
            ("init_state 0", lambda: model.init_state(0), ("batch_size",)),
            ("init_state float", lambda: model.init_state(2.0), ("batch_size",)),
            ("state not a state", lambda: model(tokens, state={"layers": []}), ("state",)),
            ("state of another model", lambda: model(tokens, state=other.init_state(b)), ("state",)),
            (
                "state of another batch size",
                lambda: model(tokens, state=model.init_state(b + 1)),
                ("state", "batch size"),
            ),
        ]
    return cases


BATTERY = [(name, label) for name in PRESETS for label, _, _ in bad_calls(tiny(name))]


@pytest.mark.parametrize("name, label", BATTERY, ids=[f"{n}-{label.replace(' ', '_')}" for n, label in BATTERY])
def test_bad_call(name, label):
    model = tiny(name)
    _, thunk, names = next(case for case in bad_calls(model) if case[0] == label)
    clear_error(thunk, *names)


class NoneOfTheTypes:
    """A value no annotation accepts, with a repr that is the same in every process (an ``object()``'s holds
    its address, so pytest-xdist's workers would collect differently named tests)."""

    def __repr__(self) -> str:
        return "NoneOfTheTypes()"


def wrong_values(tp) -> list:
    """Values of the wrong type for an annotation (see zoo.config.matches_type)."""
    if tp is bool:
        return ["yes", 1, None]
    if tp is int:
        return [True, 2.5, "4", None]
    if tp is float:
        return [True, "0.1", float("nan"), None]
    if tp is str:
        return [3, None, ["a"]]
    if tp == (int | None):
        return [2.5, "x"]
    return [NoneOfTheTypes()]


def typed_fields(options_cls):
    hints = field_types(options_cls)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(options_cls)]


PART_OPTIONS = [
    (axis, name, key, value)
    for axis, registry in (("attention", ATTENTION), ("residual", RESIDUAL), ("stack", STACK), ("position", POSITION))
    for name in registry.list()
    for key, tp in typed_fields(registry.get(name).Options)
    for value in wrong_values(tp)
]


@pytest.mark.parametrize(
    "axis, name, key, value", PART_OPTIONS, ids=[f"{a}-{n}-{k}-{v!r}" for a, n, k, v in PART_OPTIONS]
)
def test_every_part_option_is_type_checked(axis, name, key, value):
    base = get_preset("vanilla_lm").tiny
    if axis == "stack":  # a stack that adds its own position signal is refused beside a model position
        base = {**base, "position": {"name": "none"}}
    options = {"name": name, key: value}
    if axis == "attention":
        options = {"name": name, **ATTENTION.get(name).contract_options(), key: value}
    error = clear_error(lambda: zoo.create_model("vanilla_lm", **zoo.config.merge_config(base, {axis: options})), key)
    assert isinstance(error, ArgumentTypeError) or "must be" in str(error)


# "name" is create_model's preset argument, checked by the registry
MODEL_FIELDS = [
    (key, value)
    for key, tp in typed_fields(ModelConfig)
    if key not in (*zoo.config.PART_AXES, "name")
    for value in wrong_values(tp)
]


@pytest.mark.parametrize("key, value", MODEL_FIELDS, ids=[f"{k}-{v!r}" for k, v in MODEL_FIELDS])
def test_every_model_config_field_is_type_checked(key, value):
    clear_error(lambda: zoo.create_model("vanilla_lm", **{**get_preset("vanilla_lm").tiny, key: value}), key)


@pytest.mark.parametrize(
    "key, value",
    [
        ("vocab_size", 0),
        ("d_model", -32),
        ("n_layers", 0),
        ("n_heads", -1),
        ("d_ff", 0),
        ("ff_chunk_size", -1),
        ("n_encoder_layers", -1),
        ("src_vocab_size", -5),
        ("dropout", 1.0),
        ("attention_dropout", -0.1),
        ("label_smoothing", 1.5),
    ],
)
def test_negative_or_out_of_range_model_values(key, value):
    clear_error(lambda: zoo.create_model("vanilla_lm", **{**get_preset("vanilla_lm").tiny, key: value}), key)


@pytest.mark.parametrize("key", ["pad_id", "bos_id", "eos_id"])
@pytest.mark.parametrize("value", [-1, 32])
def test_seq2seq_special_ids_lie_in_the_vocabulary(key, value):
    clear_error(lambda: tiny("vanilla_seq2seq", **{key: value}), key)


@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"layer_index": -1}, "layer_index"),
        ({"layer_index": 1.0}, "layer_index"),
        ({"dropout": "0.1"}, "dropout"),
        ({"d_model": 32.0}, "d_model"),
        ({"n_heads": 0}, "n_heads"),
    ],
)
def test_attention_constructor_arguments(name, kwargs, key):
    cls = ATTENTION.get(name)
    args = {"d_model": 32, "n_heads": 4, "causal": cls.causal_only, **cls.contract_options(), **kwargs}
    clear_error(lambda: zoo.create_attention(name, **args), key)


@pytest.mark.parametrize("name", MECHANISMS)
def test_attention_call_arguments(name):
    cls = ATTENTION.get(name)
    attn = zoo.create_attention(name, d_model=32, n_heads=4, causal=cls.causal_only, **cls.contract_options())
    x = torch.randn(2, 8, 32)
    clear_error(lambda: attn(torch.randn(2, 0, 32)), "empty")
    clear_error(lambda: attn(torch.randn(0, 8, 32)), "empty")
    clear_error(lambda: attn(torch.randn(2, 8, 16)), "d_model")
    clear_error(lambda: attn(x.long()), "x")
    clear_error(lambda: attn(x, pad_mask=torch.ones(2, 8)), "pad_mask")
    clear_error(lambda: attn(x, pad_mask=torch.ones(2, 7, dtype=torch.bool)), "pad_mask")
    if not cls.supports_memory:
        clear_error(lambda: attn(x, state=[]), "state")


# -- the app's data layer ------------------------------------------------------------------------


def test_empty_data_file_names_the_file(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    clear_error(lambda: create_task("char_lm", batch_size=2, seq_len=8, path=str(path)), str(path))


def test_binary_file_with_vocab_chars_names_the_key_and_file(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 20)
    error = clear_error(
        lambda: create_task("char_lm", batch_size=2, seq_len=8, path=str(path), vocab="chars"), "data.vocab"
    )
    assert str(path) in str(error)
    create_task("char_lm", batch_size=2, seq_len=8, path=str(path), vocab="bytes")  # the same file as bytes is fine


@pytest.mark.parametrize(
    "split", [[0.9, 0.9, 0.9], [0.9, 100, 100], [0.0, 0.5, 0.5], [0.9, 0.1], [-0.1, 0.5, 0.5], "0.9", [0.9, "a", 0.05]]
)
def test_bad_data_split_names_the_key(tmp_path, split):
    path = tmp_path / "text.txt"
    path.write_text("hello world " * 300)
    clear_error(lambda: create_task("char_lm", batch_size=2, seq_len=8, path=str(path), split=split), "data.split")


def test_a_file_that_is_not_the_imdb_archive_names_the_file(tmp_path):
    path = tmp_path / "aclImdb_v1.tar.gz"
    path.write_bytes(b"not a tarball")
    clear_error(lambda: create_task("imdb", batch_size=2, seq_len=8, path=str(path)), str(path))


TASK_OPTIONS = [
    (task, key, value)
    for task in zoo.data.list_tasks()
    for key, tp in typed_fields(zoo.data.TASK.get(task).Options)
    for value in wrong_values(tp)
]


@pytest.mark.parametrize("task, key, value", TASK_OPTIONS, ids=[f"{t}-{k}-{v!r}" for t, k, v in TASK_OPTIONS])
def test_every_data_option_is_type_checked(task, key, value):
    clear_error(lambda: create_task(task, batch_size=2, seq_len=16, **{key: value}), f"data.{key}")


@pytest.mark.parametrize("task", zoo.data.list_tasks())
@pytest.mark.parametrize(
    "key, value", [("batch_size", 0), ("batch_size", 2.0), ("seq_len", -8), ("seq_len", True), ("seed", "0")]
)
def test_task_arguments(task, key, value):
    args = {"batch_size": 2, "seq_len": 16, key: value}
    clear_error(lambda: create_task(task, **args), key)


def test_type_rules():
    """The annotation-derived rules themselves: bool is not an int, an int is a float, None only when optional."""
    from zoo.config import matches_type

    assert matches_type(3, float) and not matches_type(True, float) and not matches_type(math.inf, float)
    assert matches_type(False, bool) and not matches_type(0, bool)
    assert matches_type(None, int | None) and not matches_type(None, int)
    assert matches_type((1, 2.5), list[float]) and not matches_type("12", list[float])


@pytest.mark.parametrize("task", zoo.data.list_tasks())
@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"split": "valid"}, "split"),
        ({"index": -1}, "index"),
        ({"index": 1.5}, "index"),
        ({"rank": 2, "world_size": 2}, "rank"),
        ({"world_size": 0}, "world_size"),
        ({"rank": "0"}, "rank"),
    ],
)
def test_batch_request_arguments(task, kwargs, key, tmp_path):
    options = {}
    if task in ("char_lm", "enwik8", "text8"):
        path = tmp_path / "text.txt"
        path.write_text("hello world " * 300)
        options = {"path": str(path), "split": [0.8, 0.1, 0.1]}
    elif "path" in {f.name for f in dataclasses.fields(zoo.data.TASK.get(task).Options)}:
        pytest.skip("needs its data files in their published layout")
    elif task == "listops":
        options = {"min_length": 4, "max_length": 16, "eval_size": 4}  # short trees fit seq_len 32
    fields = {f.name for f in dataclasses.fields(zoo.data.TASK.get(task).Options)}
    if {"train_chars", "eval_chars"} <= fields:  # generated text: a small sample is enough here (was 7-12 s a case)
        options = {**options, "train_chars": 4096, "eval_chars": 1024}
    made = create_task(task, batch_size=2, seq_len=32, **options)
    args = {"split": "train", "index": 0, **kwargs}
    clear_error(lambda: made.batch(args.pop("split"), args.pop("index"), **args), key)


@pytest.mark.parametrize("name", LM_PRESETS)
def test_generate_past_a_learned_position_table_is_refused_up_front(name):
    if zoo.preset_config(name).position["name"] == "none":
        pytest.skip("no absolute position table")
    model = tiny(name, position="learned", max_len=12)
    if not model.attentions_keep_state():  # the recomputing path slides a window: any length works
        assert model.generate(ids(1, 8), 10).shape == (1, 18)
        return
    clear_error(lambda: model.generate(ids(1, 8), 10), "max_new_tokens")
    assert model.generate(ids(1, 8), 4).shape == (1, 12)  # exactly fills the table


def test_seq2seq_decode_past_a_learned_position_table_is_refused_up_front():
    model = tiny("vanilla_seq2seq", position="learned", max_len=8)
    clear_error(lambda: model.generate(ids(1, 5), max_len=9), "max_len")
    assert model.generate(ids(1, 5), max_len=8).shape[0] == 1


@pytest.mark.parametrize("name", [n for n in MECHANISMS if ATTENTION.get(n).supports_cross])
@pytest.mark.parametrize(
    "context",
    [torch.randn(2, 5, 32, dtype=torch.float64), torch.randn(2, 0, 32), torch.randn(3, 5, 32), torch.randn(2, 5, 16)],
    ids=["float64", "empty", "batch", "width"],
)
def test_cross_attention_context(name, context):
    attn = zoo.create_attention(name, d_model=32, n_heads=4, **ATTENTION.get(name).contract_options())
    clear_error(lambda: attn(torch.randn(2, 8, 32), context=context), "context")


@pytest.mark.parametrize("axis", zoo.config.PART_AXES)
@pytest.mark.parametrize("value", [None, 3, ["lsh"], [3]])
def test_a_part_must_be_a_name_or_a_dict(axis, value):
    """... or, for an axis that takes per-layer parts (attention), a list of names or dicts."""
    build = lambda: zoo.create_model("vanilla_lm", **{**get_preset("vanilla_lm").tiny, axis: value})  # noqa: E731
    if axis in zoo.config.LAYERED_AXES and value == ["lsh"]:
        assert [b.attention.registry_name for b in build().stack.blocks] == ["lsh", "lsh"]
        return
    clear_error(build, axis)


@pytest.mark.parametrize(
    "other",
    [{"n_heads": 2}, {"attention": {"name": "adaptive_span", "max_span": 16, "ramp": 4, "block_size": 8}}],
    ids=["heads", "mechanism"],
)
def test_state_of_a_same_named_but_different_model_is_refused(other):
    """The state signature covers the mechanism and head count, not only preset name and size."""
    model, different = tiny("vanilla_lm"), tiny("vanilla_lm", **other)
    state = different(ids(2, 4), state=different.init_state(2)).state
    clear_error(lambda: model(ids(2, 4), state=state), "state")


@pytest.mark.parametrize("case", ["empty", "binary_chars", "overlapping_split"])
def test_the_app_names_the_file_or_key_when_the_task_is_built(case, tmp_path):
    """The same three through the Hydra app: the error comes from building the task, before any model."""
    pytest.importorskip("hydra")
    from zoo.app.compose import compose
    from zoo.app.run import build

    path = tmp_path / "data.bin"
    path.write_bytes(b"" if case == "empty" else bytes(range(256)) * 40)
    overrides = {"empty": [], "binary_chars": ["data.vocab=chars"], "overlapping_split": ["data.split=[0.9,0.9,0.9]"]}[
        case
    ]
    cfg = compose(["experiment=tiny", "data=char_lm", f"data.path={path}", "trainer.device=cpu", *overrides])
    expected = {"empty": str(path), "binary_chars": "data.vocab", "overlapping_split": "data.split"}[case]
    clear_error(lambda: build(cfg), expected)


ADAPTIVE = {"cutoffs": [8, 16], "div_val": 2}


def test_adaptive_softmax_lm_refuses_float_targets_and_empty_input_and_scores_padding_as_zero():
    """The adaptive input/softmax head goes through the same checks as the full softmax."""
    model = tiny("vanilla_lm", adaptive=ADAPTIVE).train()
    tokens = ids(2, 8)
    clear_error(lambda: model(tokens, tokens.float()), "targets")
    clear_error(lambda: model(tokens, tokens + 100), "targets")
    clear_error(lambda: model(ids(2, 0)), "tokens")
    clear_error(lambda: model(tokens.float()), "tokens")
    out = model(tokens, torch.full_like(tokens, -100))
    assert float(out.loss.detach()) == 0.0 and int(out.stats["scored"]) == 0
    out = model(tokens, tokens, pad_mask=torch.ones(2, 8, dtype=torch.bool))
    assert int(out.stats["scored"]) == 16 and torch.isfinite(out.loss)
