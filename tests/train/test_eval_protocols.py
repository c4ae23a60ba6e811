"""Evaluation protocols (zoo/train/eval_protocols.py): sliding windows score each token once with the
longest context; memory carries state with the paper's evaluation memory; segment carries none."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

import zoo
from zoo.data import create_task
from zoo.train.eval_protocols import (
    ProtocolSettings,
    add_protocol_arguments,
    evaluate_protocol,
    protocol_settings,
    sliding_batches,
)
from zoo.train.scoring import evaluate_model


@pytest.mark.parametrize("n,seq_len,stride", [(50, 8, 1), (50, 8, 3), (50, 8, 8), (9, 8, 4), (5, 8, 2), (100, 16, 5)])
def test_sliding_scores_every_target_once_with_the_longest_context(n, seq_len, stride):
    stream = np.arange(n)
    seen = {}
    for batch in sliding_batches(stream, seq_len, stride, batch_size=3):
        for tokens, targets in zip(batch["tokens"], batch["targets"]):
            for position, target in enumerate(targets.tolist()):
                if target != -100:
                    assert target not in seen
                    seen[target] = position + 1  # tokens of context this prediction saw
                    assert int(tokens[position]) == target - 1
    assert sorted(seen) == list(range(1, n))
    window = min(seq_len, n - 1)
    for target, context in seen.items():  # each token sees min(its index, window - stride + 1 ...) at least
        assert context >= min(target, window - stride + 1)
    if stride == 1:
        assert all(context == min(target, window) for target, context in seen.items())


def text_task(tmp_path, seq_len=8, batch_size=2):
    g = torch.Generator().manual_seed(0)
    path = tmp_path / "text.txt"
    path.write_bytes(bytes((97 + torch.randint(0, 5, (400,), generator=g)).tolist()))
    return create_task("char_lm", batch_size=batch_size, seq_len=seq_len, path=str(path), split=[0.5, 0.25, 0.25])


def test_sliding_stride_one_equals_recomputing_each_prefix(tmp_path):
    torch.manual_seed(0)
    task = text_task(tmp_path)
    model = zoo.create_model(
        "vanilla_lm", vocab_size=256, d_model=16, n_layers=1, n_heads=2, d_ff=32, dropout=0.0
    ).eval()
    result = evaluate_protocol(
        model, task, "test", ProtocolSettings(protocol="sliding", seq_len=6, stride=1, batch_size=4)
    )
    start, end = task.bounds["test"]
    stream = torch.from_numpy(np.asarray(task.data[start:end], dtype=np.int64))
    nll = 0.0
    with torch.no_grad():
        for i in range(1, len(stream)):  # target i from up to 6 tokens before it, one call each
            context = stream[max(0, i - 6) : i][None]
            nll -= float(torch.log_softmax(model(context).logits[0, -1], -1)[stream[i]])
    assert result["test/scored"] == len(stream) - 1
    assert result["test/loss"] == pytest.approx(nll / (len(stream) - 1), rel=1e-5)


def test_memory_protocol_sets_and_restores_the_evaluation_memory(tmp_path):
    torch.manual_seed(1)
    task = text_task(tmp_path)
    xl = {"attention": {"mem_len": 8, "block_size": 4}, "dropout": 0.0}
    model = zoo.create_model("transformer_xl", vocab_size=256, d_model=16, n_layers=2, n_heads=2, d_ff=32, **xl)
    plain = evaluate_model(model, task, "val", 0)
    same = evaluate_protocol(model, task, "val", ProtocolSettings(protocol="memory"))
    assert same["val/loss"] == pytest.approx(plain["val/loss"], rel=1e-6)  # the trainer's evaluation carries memory too
    longer = evaluate_protocol(model, task, "val", ProtocolSettings(protocol="memory", mem_len=32, clamp_len=6))
    assert longer["settings"]["attentions_set"] == 2
    assert longer["val/loss"] != pytest.approx(plain["val/loss"], rel=1e-6)
    options = [m.options for m in model.modules() if hasattr(m, "options") and hasattr(m.options, "eval_mem_len")]
    assert all(o.eval_mem_len == 0 and o.clamp_len == 0 for o in options)  # restored
    again = evaluate_protocol(model, task, "val", ProtocolSettings(protocol="memory"))
    assert again["val/loss"] == pytest.approx(plain["val/loss"], rel=1e-6)
    none = evaluate_protocol(model, task, "val", ProtocolSettings(protocol="segment"))
    assert none["val/loss"] != pytest.approx(plain["val/loss"], rel=1e-6)  # no memory: a different score
    assert none["val/scored"] == plain["val/scored"]


def test_settings_come_from_the_paper_and_flags_override():
    parser = argparse.ArgumentParser()
    add_protocol_arguments(parser)
    config = {"paper": {"eval": {"protocol": "memory", "seq_len": 80, "mem_len": 2100, "clamp_len": 820}}}
    settings = protocol_settings(parser.parse_args([]), config)
    assert (settings.protocol, settings.seq_len, settings.mem_len, settings.clamp_len) == ("memory", 80, 2100, 820)
    settings = protocol_settings(parser.parse_args(["--mem-len", "640"]), config)
    assert settings.mem_len == 640 and settings.seq_len == 80
    assert protocol_settings(parser.parse_args([]), {}) is None
    with pytest.raises(ValueError, match="protocol must be one of"):
        ProtocolSettings(protocol="window")
    with pytest.raises(ValueError, match="unknown keys"):
        ProtocolSettings.from_dict({"protocol": "sliding", "strid": 2})


def test_every_protocol_shows_its_progress_even_outside_a_terminal(tmp_path, capsys):
    """evaluate.py --protocol stream on Tiny Shakespeare's test split printed nothing for five minutes:
    its bar showed on a terminal only. Now stderr gets it wherever it goes (here captured, not a
    terminal): the protocol, the batches done of the total; show_progress=False stays quiet."""
    task = text_task(tmp_path)
    model = zoo.create_model("vanilla_lm", vocab_size=256, d_model=16, n_layers=1, n_heads=2, d_ff=32).eval()
    for protocol, shown in (("stream", "49/49"), ("segment", "batch"), ("sliding", "batch")):
        evaluate_protocol(model, task, "test", ProtocolSettings(protocol=protocol, batch_size=2))
        err = capsys.readouterr().err
        assert f"{protocol}:" in err and shown in err, (protocol, err)
    evaluate_protocol(model, task, "test", ProtocolSettings(protocol="stream", batch_size=2), show_progress=False)
    assert capsys.readouterr().err == ""


def test_stream_protocol_feeds_each_token_through_the_cache_and_equals_one_call_per_lane(tmp_path):
    """stream, token by token through a local_1d window, scores the lanes exactly as one call over each
    whole lane does (segment protocol with the lane as one segment: 99 test tokens in 2 lanes of 49)."""
    torch.manual_seed(0)
    task = text_task(tmp_path)
    model = zoo.create_model(
        "vanilla_lm",
        vocab_size=256,
        d_model=16,
        n_layers=2,
        n_heads=2,
        d_ff=32,
        dropout=0.0,
        attention={"name": "local_1d", "block": 4, "memory": 6},
    ).eval()
    streamed = evaluate_protocol(model, task, "test", ProtocolSettings(protocol="stream", batch_size=2))
    whole = evaluate_protocol(model, task, "test", ProtocolSettings(protocol="segment", seq_len=49, batch_size=2))
    assert streamed["test/scored"] == whole["test/scored"] == 98
    assert streamed["batches"] == 49 and streamed["settings"]["seq_len"] == 1
    assert streamed["test/loss"] == pytest.approx(whole["test/loss"], rel=1e-5)


def test_stream_equals_memory_where_the_memory_holds_every_earlier_token(tmp_path):
    """Transformer-XL with a memory longer than a lane: segments of 7 with memory == token by token."""
    torch.manual_seed(0)
    task = text_task(tmp_path)
    model = zoo.create_model(
        "transformer_xl",
        vocab_size=256,
        d_model=16,
        n_layers=2,
        n_heads=2,
        d_ff=32,
        dropout=0.0,
        attention={"mem_len": 64},
    ).eval()
    memory = evaluate_protocol(model, task, "test", ProtocolSettings(protocol="memory", seq_len=7, batch_size=2))
    streamed = evaluate_protocol(model, task, "test", ProtocolSettings(protocol="stream", batch_size=2))
    assert memory["test/scored"] == streamed["test/scored"]
    assert streamed["test/loss"] == pytest.approx(memory["test/loss"], rel=1e-5)


def test_stream_protocol_refuses_a_model_that_cannot_continue_a_sequence(tmp_path):
    task = text_task(tmp_path)
    model = zoo.create_model("universal_transformer_act", vocab_size=256, d_model=16, n_layers=2, n_heads=2, d_ff=32)
    with pytest.raises(ValueError, match="cannot continue a sequence.*universal.*act=true"):
        evaluate_protocol(model, task, "test", ProtocolSettings(protocol="stream", batch_size=2))
