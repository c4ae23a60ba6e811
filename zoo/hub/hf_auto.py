"""Registers the zoo with ``transformers``' Auto classes (``AutoConfig``, ``AutoModelForCausalLM``,
``AutoModelForSequenceClassification``, ``AutoModelForSeq2SeqLM``, ``AutoTokenizer``), so after
``import zoo`` a folder written by ``save_pretrained`` loads with no ``trust_remote_code``::

    import zoo
    from transformers import AutoModelForCausalLM, pipeline
    model = AutoModelForCausalLM.from_pretrained("my-model/")
    pipeline("text-generation", model="my-model/")

Lazily: importing ``transformers``' Auto modules costs seconds, so ``import zoo`` imports none of it.
:func:`install` (called by ``zoo/__init__``) puts a finder on ``sys.meta_path`` that registers the zoo's
classes right after ``transformers`` executes each Auto module (configuration, modeling, tokenization),
and registers at once with those already imported. Without ``transformers`` installed nothing happens.
The classes: :mod:`zoo.hub.hf_config`, :mod:`zoo.hub.hf_models`, :mod:`zoo.hub.hf_seq2seq`,
:mod:`zoo.hub.hf_tokenizer`; the cache adapter: :mod:`zoo.hub.hf_cache`.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any

AUTO = "transformers.models.auto."


def register_config() -> None:
    from transformers import AutoConfig

    from zoo.hub.hf_config import ZooConfig

    AutoConfig.register(ZooConfig.model_type, ZooConfig, exist_ok=True)


def register_models() -> None:
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification

    from zoo.hub.hf_config import ZooConfig
    from zoo.hub.hf_models import ZooForCausalLM, ZooForSequenceClassification
    from zoo.hub.hf_seq2seq import ZooForSeq2SeqLM

    AutoModelForCausalLM.register(ZooConfig, ZooForCausalLM, exist_ok=True)
    AutoModelForSequenceClassification.register(ZooConfig, ZooForSequenceClassification, exist_ok=True)
    AutoModelForSeq2SeqLM.register(ZooConfig, ZooForSeq2SeqLM, exist_ok=True)


def register_tokenizer() -> None:
    from transformers import AutoTokenizer

    from zoo.hub.hf_config import ZooConfig
    from zoo.hub.hf_tokenizer import ZooByteTokenizer

    AutoTokenizer.register(ZooConfig, slow_tokenizer_class=ZooByteTokenizer, exist_ok=True)


# each Auto module, and what to register once it has run
REGISTER: dict[str, Callable[[], None]] = {
    AUTO + "configuration_auto": register_config,
    AUTO + "modeling_auto": register_models,
    AUTO + "tokenization_auto": register_tokenizer,
}


class RegisterAfterImport:
    """Finds nothing itself: for a module in REGISTER it wraps the real loader so that the zoo registers
    right after the module's code has run. (Not an ``importlib.abc`` subclass: importing that module
    would cost ``import zoo`` more than this finder does.)"""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in REGISTER:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = RegisteringLoader(spec.loader, REGISTER[fullname])
                return spec
        return None


class RegisteringLoader:
    def __init__(self, loader: Any, register: Callable[[], None]):
        self.loader, self.register = loader, register

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        sys.modules[module.__name__] = module  # registering imports the module's siblings, which import it
        self.register()


def install() -> None:
    """Register with the Auto modules already imported, and with the others when they are (a no-op
    without transformers; installing twice adds one finder)."""
    if importlib.util.find_spec("transformers") is None:
        return
    if not any(isinstance(finder, RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, RegisterAfterImport())
    for name, register in REGISTER.items():
        if name in sys.modules:
            register()
