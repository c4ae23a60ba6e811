"""The GPT-2 / Llama initialisation (Radford et al. 2019, "Language Models are Unsupervised Multitask
Learners", Section 2.3; HF ``GPT2PreTrainedModel._init_weights`` and ``LlamaPreTrainedModel``'s).

Exactly what it redraws, with std = ``std`` (0.02):

- every attention's projections (``to_q``, ``to_k``, ``to_v``, ``to_qk``, ``to_out``, the names
  ``Attention.add_projections`` and LSH's shared query-key give them) and every ``nn.Linear`` of each
  block's feed-forward part: weights N(0, std), biases 0;
- the output projections, the attention's ``to_out`` and the feed-forward's ``output_projection()``
  (mlp's W2, a gated unit's down_proj, sepconv's last pointwise map): N(0, std / sqrt(2 n_layers))
  when ``scale_depth`` (GPT-2's "scale the weights of residual layers by 1/sqrt(N)", N = 2 n_layers
  residual branches, as HF's GPT-2 does for c_proj; Llama's reference code does not scale);
- the token table N(0, std) read unscaled (no sqrt(d_model)), tied to the LM head as before; an untied
  output head (LM or classifier) N(0, std), bias 0; learned position tables N(0, std).

Everything else keeps its part's own initialisation: norms (weight 1, bias 0), relative-position
tables and biases inside mechanisms, residual gates (GTrXL's GRU gate, rezero's alpha), the universal
stack's halting unit, mechanism-specific maps (adaptive span's span predictor, Sinkhorn's sort net,
Synthesizer's rows, Longformer's global projections) and sepconv's depthwise taps. Refused: adaptive
input/softmax (its clusters have their own scales) and ``token_init_std`` (this scheme sets the table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from zoo.attention.base import Attention
from zoo.config import require
from zoo.feed_forward.base import FeedForward
from zoo.init.base import INIT, Init, reset_tables

PROJECTIONS = ("to_q", "to_k", "to_v", "to_qk", "to_out")  # Attention.add_projections' names (LSH: to_qk)


def normal_linear(linear: nn.Linear, std: float) -> None:
    nn.init.normal_(linear.weight, std=std)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


@INIT.register("gpt2")
class GPT2Init(Init):
    @dataclass
    class Options:
        std: float = 0.02  # GPT-2's and Llama's initializer_range
        scale_depth: bool = True  # output projections at std / sqrt(2 n_layers) (GPT-2); False: Llama's plain std

        def __post_init__(self) -> None:
            require(self.std > 0.0, f"init 'gpt2': std must be > 0, got {self.std}")

    def check(self, config) -> None:
        require(not config.adaptive, "init=gpt2 draws a plain token table; adaptive input has its own clusters")
        require(
            not config.token_init_std,
            f"init=gpt2 sets the token table itself (N(0, init.std) read unscaled): leave token_init_std at 0 "
            f"(got {config.token_init_std})",
        )
        self.n_layers = config.n_layers

    def apply(self, model: nn.Module) -> None:
        std = self.options.std
        out_std = std / math.sqrt(2 * self.n_layers) if self.options.scale_depth else std
        reset_tables(model, std)
        head = getattr(model, "head", None)
        if isinstance(head, nn.Linear) and head.weight is not getattr(getattr(model, "embed", None), "weight", None):
            normal_linear(head, std)  # an untied LM head (a tied one is the token table, drawn above)
        for module in model.modules():
            if isinstance(module, Attention):
                for name in PROJECTIONS:
                    linear = getattr(module, name, None)
                    if isinstance(linear, nn.Linear):
                        normal_linear(linear, out_std if name == "to_out" else std)
            elif isinstance(module, FeedForward):
                for linear in module.modules():
                    if isinstance(linear, nn.Linear):
                        normal_linear(linear, std)
                normal_linear(module.output_projection(), out_std)
