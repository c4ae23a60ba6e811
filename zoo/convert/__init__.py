"""Conversions between the zoo's models and other libraries' (one module per family). ``transformers``
is imported only when a conversion that builds one of its models runs.

- :func:`from_llama` / :func:`to_llama`: Hugging Face ``LlamaForCausalLM`` <-> ``transformer_pp``.
"""

from zoo.convert.llama import from_llama, to_llama

__all__ = ["from_llama", "to_llama"]
