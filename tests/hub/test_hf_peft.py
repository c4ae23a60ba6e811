"""PEFT's LoRA on a zoo model loaded with AutoModelForCausalLM: adapters on the attention projections of
any causal mechanism (zoo.hub.hf_models.attention_projections) train, and merging them gives the model the
adapters computed (merged == unmerged), which save_pretrained writes as a plain zoo folder again."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", minversion="5.24")
pytest.importorskip("peft", minversion="0.21")

import torch  # noqa: E402
from support.fast_cases import FAST_MECHANISMS, default_run_keeps  # noqa: E402

import zoo  # noqa: E402
from tests.hub.hf_helpers import byte_lm, prompt  # noqa: E402
from zoo.attention.base import ATTENTION  # noqa: E402

NAMES = zoo.list_attention()


@pytest.mark.parametrize("name", default_run_keeps(NAMES, FAST_MECHANISMS))
def test_lora_on_the_attention_projections_trains_and_merges(tmp_path, name):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from zoo.hub.hf_models import attention_projections

    cls = ATTENTION.get(name)
    if not cls.supports_causal:
        pytest.skip(f"{name} builds no causal LM: {cls.no_causal_reason}")
    byte_lm(name).save_pretrained(tmp_path / "base")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    tokens = prompt(b=4, t=24)
    with torch.no_grad():
        before = base(tokens).logits.clone()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=attention_projections(base), lora_dropout=0.0)
    model = get_peft_model(base, config)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    model.train()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(6):
        loss = model(input_ids=tokens, labels=tokens).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    model.eval()
    with torch.no_grad():
        adapted = model(input_ids=tokens).logits
        assert not torch.allclose(adapted, before, atol=1e-4)  # the adapters are in the computation
        merged = model.merge_and_unload()
        torch.testing.assert_close(merged(tokens).logits, adapted, atol=1e-4, rtol=1e-4)
    merged.save_pretrained(tmp_path / "merged")
    with torch.no_grad():
        torch.testing.assert_close(
            zoo.from_pretrained(tmp_path / "merged")(tokens).logits, adapted, atol=1e-4, rtol=1e-4
        )
