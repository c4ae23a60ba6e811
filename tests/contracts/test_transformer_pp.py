"""Every causal mechanism runs inside ``transformer_pp``, the rest of the block kept (pre-RMSNorm, SwiGLU,
unscaled embeddings, no biases): by flag, never by name. A mechanism that takes rotary positions runs
with them; one that does not (by its flags or options) refuses ``rope`` with its reason and runs with
``position=none``. Where the model can continue a stream, token by token equals one call.
"""

from __future__ import annotations

import pytest
import torch
from support.fast_cases import FAST_MECHANISMS, default_run_keeps

import zoo
from zoo.attention.base import ATTENTION

VOCAB = 24
CAUSAL = [n for n in zoo.list_attention() if ATTENTION.get(n).supports_causal]


def transformer_pp(name, **extra):
    attention = {"name": name, **ATTENTION.get(name).contract_options()}
    torch.manual_seed(0)
    return zoo.create_model(
        "transformer_pp", vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, d_ff=40, attention=attention, **extra
    ).eval()


@pytest.mark.parametrize("name", default_run_keeps(CAUSAL, FAST_MECHANISMS))
def test_every_causal_mechanism_runs_inside_the_transformer_pp_block(name):
    try:
        model = transformer_pp(name)
    except ValueError as refusal:  # by its flags or its options (additive's concat scores), with the reason
        assert "cannot take position 'rope'" in str(refusal)
        model = transformer_pp(name, position="none")
    for block in model.stack.blocks:  # the block around the mechanism is Transformer++'s
        assert block.attention.registry_name == name
        assert type(block.attention_residual).__name__ == "PreNorm"
        assert block.attention_residual.norm.registry_name == "rmsnorm"
        assert block.feed_forward.registry_name == "swiglu"
    assert model.embed.scale == 1.0 and model.norm.registry_name == "rmsnorm"
    tokens = torch.randint(0, VOCAB, (2, 21), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = model(tokens).logits
        assert torch.isfinite(whole).all()
        if model.stream_refusal() is not None:
            return
        state, steps = model.init_state(2), []
        for i in range(tokens.shape[1]):
            out = model(tokens[:, i : i + 1], state=state)
            state = out.state
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), whole, atol=1e-4, rtol=1e-4)
