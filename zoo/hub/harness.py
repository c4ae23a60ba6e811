"""lm-evaluation-harness on zoo models: its own command line, run after ``import zoo`` so that
``--model hf --model_args pretrained=<folder>`` finds the zoo's Auto classes (the harness imports only
transformers, and transformers knows no model type it was not told about)::

    python -m zoo.hub.harness run --model hf --model_args pretrained=my-model/ --tasks lambada_openai

Every argument is the harness's (``lm-eval run --help``). The folder's byte tokenizer
(:mod:`zoo.hub.hf_tokenizer`) scores text exactly as the zoo's byte-level tasks encode it.
"""

from __future__ import annotations

import zoo  # noqa: F401  (registers the zoo with transformers' Auto classes: zoo/hub/hf_auto.py)


def main() -> None:
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        raise SystemExit(
            "lm-evaluation-harness is not installed: pip install 'transformer-zoo[hf]' (or pip install lm-eval)"
        ) from None
    cli_evaluate()


if __name__ == "__main__":
    main()
