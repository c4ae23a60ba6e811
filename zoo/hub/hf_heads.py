"""The zoo's heads by ``transformers`` Auto class: ``kind="lm"`` for ``AutoModelForCausalLM``, ``classifier``
for ``AutoModelForSequenceClassification``, ``seq2seq`` for ``AutoModelForSeq2SeqLM`` (the wrappers:
:mod:`zoo.hub.hf_models`, :mod:`zoo.hub.hf_seq2seq`). zoo/hub/hf_auto.py calls :func:`register`.
"""

from __future__ import annotations

from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification

from zoo.hub.hf_config import ZooConfig
from zoo.hub.hf_models import ZooForCausalLM, ZooForSequenceClassification
from zoo.hub.hf_seq2seq import ZooForSeq2SeqLM

AUTO_CLASSES = {
    AutoModelForCausalLM: ZooForCausalLM,
    AutoModelForSequenceClassification: ZooForSequenceClassification,
    AutoModelForSeq2SeqLM: ZooForSeq2SeqLM,
}


def register() -> None:
    for auto_class, wrapper in AUTO_CLASSES.items():
        auto_class.register(ZooConfig, wrapper, exist_ok=True)
