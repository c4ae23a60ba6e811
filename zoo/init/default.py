"""Every part's own initialisation (the scheme of every preset and checkpoint before the init axis).

What that is, by part: ``nn.Linear``'s default (Kaiming-uniform weights, uniform biases, both
U(-1/sqrt(fan_in), 1/sqrt(fan_in))); the token table N(0, 1/d_model) read times sqrt(d_model)
(Vaswani et al. 2017, arXiv:1706.03762, Section 3.4), or with ``token_init_std`` > 0 a plain table;
learned positions N(0, ``position.init_std``); norms at weight 1, bias 0; each mechanism's and
residual's own (rezero's alpha 0, GTrXL's gate bias 2, ...).

``table_std`` > 0 makes the embedding tables plain N(0, table_std) tables read unscaled, the token
table and every learned position table (BERT's and the PyTorch LRA code's 0.02): the LRA finding of
``results/lra_parity`` (our scaled tables stall ListOps at lr 1e-4 where the reference's learn) as one
switch to sweep. ``lra_setting=nystromformer`` still says it with ``token_init_std`` and
``position.init_std`` (unchanged, so its runs replay); ``init.table_std=0.02`` draws the same
distributions.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from zoo.config import require
from zoo.init.base import INIT, Init, reset_tables


@INIT.register("default")
class DefaultInit(Init):
    @dataclass
    class Options:
        table_std: float = 0.0  # > 0: token and learned position tables N(0, table_std), read unscaled

        def __post_init__(self) -> None:
            require(
                self.table_std >= 0.0,
                f"init 'default': table_std must be >= 0 (0 = the parts' own), got {self.table_std}",
            )

    def check(self, config) -> None:
        if self.options.table_std:
            require(
                not config.token_init_std,
                "init.table_std and token_init_std both set the token table: set one (token_init_std alone keeps "
                "the learned positions at position.init_std)",
            )
            require(
                not config.adaptive, "init.table_std sets the plain token table; adaptive input has its own clusters"
            )

    def apply(self, model: nn.Module) -> None:
        if self.options.table_std:
            reset_tables(model, self.options.table_std)
