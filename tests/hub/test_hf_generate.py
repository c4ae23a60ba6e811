"""transformers' ``generate`` and ``pipeline("text-generation")`` on zoo models, through the zoo's own
caches (zoo/hub/hf_cache.py): greedy decoding equals the zoo's ``generate`` token for token, for every
causal mechanism (by flags over zoo.list_attention()) and every causal preset, loaded with
``AutoModelForCausalLM.from_pretrained`` from the folder ``save_pretrained`` wrote."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", minversion="5.24")

import torch  # noqa: E402
from support.fast_cases import FAST_MECHANISMS, FAST_PRESETS, default_run_keeps  # noqa: E402

import zoo  # noqa: E402
from tests.hub.hf_helpers import byte_lm, decoding_lm, diversify, prompt  # noqa: E402
from zoo.attention.base import ATTENTION  # noqa: E402
from zoo.presets.factory import get_preset  # noqa: E402

NAMES = zoo.list_attention()


def load(tmp_path, model):
    from transformers import AutoModelForCausalLM

    model.save_pretrained(tmp_path / "m")
    return AutoModelForCausalLM.from_pretrained(tmp_path / "m"), zoo.from_pretrained(tmp_path / "m")


@pytest.mark.parametrize("name", default_run_keeps(NAMES, FAST_MECHANISMS))
def test_greedy_hf_generate_equals_the_zoos_for_every_mechanism(tmp_path, name):
    """Token for token, batch of two; a mechanism that streams decodes through its state (the ZooCache
    HF returns has seen every token but the last), one that cannot recomputes its prefix as the zoo does."""
    cls = ATTENTION.get(name)
    if not cls.supports_causal:
        pytest.skip(f"{name} builds no causal LM: {cls.no_causal_reason}")
    tokens, new = prompt(), 12
    hf, model = load(tmp_path, decoding_lm(name, tokens, new))
    ours = model.generate(tokens, new, greedy=True)
    out = hf.generate(tokens, max_new_tokens=new, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ours)
    from zoo.hub.hf_cache import ZooCache

    if model.stream_refusal() is None:
        assert isinstance(out.cache, ZooCache) and out.cache.get_seq_length() == tokens.shape[1] + new - 1
    else:
        assert out.cache is None, model.stream_refusal()


CAUSAL_PRESETS = [n for n in zoo.list_models() if zoo.preset_config(n, **get_preset(n).tiny).kind == "lm"]


@pytest.mark.parametrize("preset", default_run_keeps(CAUSAL_PRESETS, FAST_PRESETS))
def test_every_causal_preset_loads_with_automodel_and_decodes_as_the_zoo(tmp_path, preset):
    """After ``import zoo``: AutoModelForCausalLM reads any causal preset's folder, its logits are the
    zoo's, and greedy generation equals the zoo's."""
    spec = get_preset(preset)
    model = zoo.create_model(preset, **spec.tiny).eval()
    diversify(model)
    hf, loaded = load(tmp_path, model)
    vocab = model.config.vocab_size
    tokens = torch.randint(0, vocab, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens).logits)
    new = min(6, model.config.max_len - 5)
    assert torch.equal(
        hf.generate(tokens, max_new_tokens=new, do_sample=False), loaded.generate(tokens, new, greedy=True)
    )


def test_pipeline_loads_from_the_folder_alone(tmp_path):
    """pipeline("text-generation", model=folder): model and byte tokenizer from the folder save_pretrained
    wrote (no tokenizer file in it), and the text it continues with is the zoo's greedy continuation."""
    from transformers import pipeline

    model = byte_lm("vanilla")
    model.save_pretrained(tmp_path / "m")
    text = "To be, or"
    generate = pipeline("text-generation", model=str(tmp_path / "m"))
    got = generate(text, max_new_tokens=10, do_sample=False)[0]["generated_text"]
    ids = torch.tensor([list(text.encode("utf-8"))])
    expected = bytes(model.generate(ids, 10, greedy=True)[0].tolist()).decode("utf-8", errors="replace")
    assert got == expected


def test_byte_tokenizer_round_trips_utf8(tmp_path):
    from transformers import AutoTokenizer

    byte_lm().save_pretrained(tmp_path / "m")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "m")
    text = "naïve — ok\n"
    ids = tokenizer(text)["input_ids"]
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text
    batch = tokenizer(["ab", "abcd"], padding=True, return_tensors="pt")
    assert batch["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]  # right padding, byte 0


@pytest.mark.parametrize("name", default_run_keeps(NAMES, FAST_MECHANISMS))
def test_beam_search_reorders_the_zoo_state(tmp_path, name):
    """HF beam search through the ZooCache (reordered by zoo.models.base.reorder_state at every step) equals
    beam search recomputing every prefix (use_cache=False), and is not just greedy decoding; a state whose
    tensors are not all batch-first is refused (never reordered into mixed-up beams)."""
    cls = ATTENTION.get(name)
    if not cls.supports_causal:
        pytest.skip(f"{name} builds no causal LM: {cls.no_causal_reason}")
    tokens, new = prompt(), 8
    hf, model = load(tmp_path, decoding_lm(name, tokens, new))
    if model.stream_refusal() is not None:
        pytest.skip(f"{name} keeps no state to reorder: {model.stream_refusal()}")
    greedy = hf.generate(tokens, max_new_tokens=new, do_sample=False)
    for width in (3, 5, 8):  # wider beams until the search leaves the greedy path (a random model may not at 3)
        beams = dict(max_new_tokens=new, num_beams=width, do_sample=False)
        recomputed = hf.generate(tokens, **beams, use_cache=False)
        try:
            cached = hf.generate(tokens, **beams)
        except NotImplementedError as refusal:
            assert "first axis is not the batch" in str(refusal)
            pytest.skip(str(refusal))
        assert torch.equal(cached, recomputed), width
        if not torch.equal(cached, greedy):
            return
    pytest.fail(f"{name}: beam search of width 3, 5 and 8 all equal greedy decoding: the test proves nothing")
