"""The Auto classes after ``import zoo``: one folder (save_pretrained's) for both libraries, outputs in
transformers' conventions, activation checkpointing, the classifier and the encoder-decoder, and an
``import zoo`` that does not import transformers."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("transformers", minversion="5.24")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import zoo  # noqa: E402
from tests.hub.hf_helpers import byte_lm, diversify, prompt  # noqa: E402
from zoo.presets.factory import get_preset  # noqa: E402


def tiny(preset: str, **extra):
    model = zoo.create_model(preset, **{**get_preset(preset).tiny, "dropout": 0.0, **extra})
    diversify(model)
    return model.eval()


def test_one_folder_for_both_libraries(tmp_path):
    """AutoModelForCausalLM reads save_pretrained's folder; its save_pretrained writes the zoo's three
    files, which zoo.from_pretrained reads back to the same logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = byte_lm()
    model.save_pretrained(tmp_path / "zoo")
    config = AutoConfig.from_pretrained(tmp_path / "zoo")
    assert (config.model_type, config.vocab_size, config.hidden_size, config.max_position_embeddings) == (
        "transformer-zoo", 256, 32, 128,
    )  # fmt: skip
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "zoo")
    hf.save_pretrained(tmp_path / "hf")
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    tokens = prompt()
    with torch.no_grad():
        torch.testing.assert_close(zoo.from_pretrained(tmp_path / "hf")(tokens).logits, model(tokens).logits)
        assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float64)(tokens).logits.dtype == (
            torch.float64
        )
    with pytest.raises(TypeError, match="quantization_config"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "zoo", quantization_config={"bits": 4})


def test_outputs_in_hf_conventions(tmp_path):
    """labels are the inputs (shifted inside, -100 ignored); hidden_states: the stack's input, every layer,
    the last after the final norm; a cache continues the sequence as one call does."""
    from transformers import AutoModelForCausalLM

    model = byte_lm()
    model.save_pretrained(tmp_path / "m")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    tokens = prompt(t=10)
    labels = tokens.clone()
    labels[:, :3] = -100
    with torch.no_grad():
        out = hf(tokens, labels=labels, output_hidden_states=True)
        zoo_out = model(tokens)
        expected = F.cross_entropy(zoo_out.logits[:, 2:-1].flatten(0, 1), tokens[:, 3:].flatten())
        torch.testing.assert_close(out.loss, expected)
        assert len(out.hidden_states) == model.config.n_layers + 1
        torch.testing.assert_close(out.hidden_states[-1], zoo_out.hidden)
        first = hf(tokens[:, :7], use_cache=True)
        rest = hf(tokens[:, 7:], cache=first.cache)
        torch.testing.assert_close(torch.cat([first.logits, rest.logits], 1), zoo_out.logits, atol=1e-5, rtol=1e-5)
        assert rest.cache is first.cache and rest.cache.get_seq_length() == 10
    with pytest.raises(ValueError, match="left"):
        hf(tokens, attention_mask=torch.tensor([[0] + [1] * 9, [1] * 10]))


def test_activation_checkpointing_recomputes_every_block_with_the_same_gradients(tmp_path):
    from transformers import AutoModelForCausalLM

    byte_lm().save_pretrained(tmp_path / "m")
    tokens = prompt(t=12)

    def grads_and_calls(checkpointing: bool):
        hf = AutoModelForCausalLM.from_pretrained(tmp_path / "m").train()
        if checkpointing:
            hf.gradient_checkpointing_enable()
            assert hf.is_activation_checkpointing
        calls = []
        for block in hf.model.stack.blocks:
            block.attention.register_forward_hook(lambda *_: calls.append(1))
        hf(tokens, labels=tokens).loss.backward()
        return {n: p.grad for n, p in hf.named_parameters()}, len(calls)

    plain, plain_calls = grads_and_calls(False)
    checkpointed, checkpointed_calls = grads_and_calls(True)
    assert (plain_calls, checkpointed_calls) == (2, 4)  # each block's forward again in backward
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, msg=name)


def test_the_universal_stack_refuses_per_layer_hidden_states_and_checkpoints_through_the_zoo(tmp_path):
    """gradient_checkpointing_enable routes to the zoo's activation checkpointing (zoo/stacks/checkpointing.py), which
    recomputes the universal stack's shared block at every step; per-layer hidden states stay refused; the
    reversible stack refuses checkpointing with the reason (it recomputes already)."""
    from transformers import AutoModelForCausalLM

    tiny("universal_transformer").save_pretrained(tmp_path / "m")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "m").train()
    tokens = torch.tensor([[1, 2, 3, 4]])
    torch.manual_seed(0)
    hf(tokens, labels=tokens).loss.backward()
    plain = {n: p.grad.clone() for n, p in hf.named_parameters()}
    hf.zero_grad()
    hf.gradient_checkpointing_enable()
    assert hf.is_activation_checkpointing and "forward" in hf.model.stack.block.__dict__
    torch.manual_seed(0)
    hf(tokens, labels=tokens).loss.backward()
    for name, grad in plain.items():
        torch.testing.assert_close(hf.get_parameter(name).grad, grad, msg=name)
    hf.gradient_checkpointing_disable()
    assert not hf.is_activation_checkpointing and "forward" not in hf.model.stack.block.__dict__
    with pytest.raises(ValueError, match="one block per layer"):
        hf(torch.tensor([[1, 2, 3]]), output_hidden_states=True)
    tiny("reformer").save_pretrained(tmp_path / "r")
    with pytest.raises(ValueError, match="'reversible' recomputes every layer in backward already"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "r").gradient_checkpointing_enable()


def test_sequence_classifier(tmp_path):
    """AutoModelForSequenceClassification: the zoo classifier's logits and loss; AutoModelForCausalLM
    refuses the folder, naming what it holds."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    model = tiny("vanilla_classifier")
    model.save_pretrained(tmp_path / "m")
    hf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "m")
    assert hf.config.num_labels == model.config.n_classes
    tokens = torch.randint(0, model.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 1, 1])
    with torch.no_grad():
        out, expected = hf(tokens, labels=labels), model(tokens, labels)
    torch.testing.assert_close(out.logits, expected.logits)
    torch.testing.assert_close(out.loss, expected.loss)
    with pytest.raises(ValueError, match="classifier"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "m")


def test_seq2seq_forward_and_greedy_generation_equal_the_zoos(tmp_path):
    from transformers import AutoModelForSeq2SeqLM

    model = tiny("vanilla_seq2seq")
    model.save_pretrained(tmp_path / "m")
    hf = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "m")
    cfg = model.config
    src = torch.randint(3, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    tgt = torch.randint(3, cfg.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(src, decoder_input_ids=tgt).logits, model(src, tgt).logits)
        ours = model.generate(src, max_len=8)
        theirs = hf.generate(src, max_new_tokens=8, do_sample=False, num_beams=1)
    assert theirs[:, 0].eq(cfg.bos_id).all()  # HF keeps the decoder's start; both pad after EOS with pad_id
    assert torch.equal(theirs[:, 1:], ours), (theirs, ours)


def test_import_zoo_imports_no_transformers():
    """Registration waits for transformers' own Auto imports: ``import zoo`` costs no transformers import
    (in-process, every test above loads through the Auto classes after ``import zoo``)."""
    code = "import sys, zoo\nassert not [m for m in sys.modules if m.startswith('transformers')]\n"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


@pytest.mark.slow
def test_the_auto_classes_know_the_zoo_when_transformers_was_imported_first():
    code = (
        "from transformers import AutoConfig, AutoTokenizer\n"
        "from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING\n"
        "import zoo\n"
        "from zoo.hub.hf_config import ZooConfig\n"
        "assert AutoConfig.for_model('transformer-zoo').__class__ is ZooConfig\n"
        "assert MODEL_FOR_CAUSAL_LM_MAPPING[ZooConfig].__name__ == 'ZooForCausalLM'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_an_older_transformers_is_left_alone_with_a_warning(monkeypatch):
    """The wrappers speak transformers 5.24's cache interface: an older one is not registered with (a
    warning says why), so ``import zoo`` never breaks it."""
    import transformers

    from zoo.hub import hf_auto

    called = []
    monkeypatch.setattr(transformers, "__version__", "4.57.1")
    monkeypatch.setitem(sys.modules, "zoo.hub.hf_config", type(sys)("stand_in"))
    sys.modules["zoo.hub.hf_config"].register = lambda: called.append(1)
    with pytest.warns(UserWarning, match="older than"):
        hf_auto.register(hf_auto.AUTO + "configuration_auto")
    assert not called
    monkeypatch.setattr(transformers, "__version__", "5.24.0")
    hf_auto.register(hf_auto.AUTO + "configuration_auto")
    assert called == [1]
