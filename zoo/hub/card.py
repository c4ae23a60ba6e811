"""The model card (``README.md``) of a shared model, made from its ``config.json`` alone.

YAML metadata the Hub reads (``library_name``, ``tags`` with the paper's ``arxiv:`` id, so the Hub
links it), then: the preset and what it is, the paper, the parameter count, the architecture, the
training data and the metric when the model came from a run (``experiments/export.py``), and how
to load it. Every value is written as JSON, which is valid YAML, so no quoting can go wrong.
"""

from __future__ import annotations

import json
import re
from typing import Any

from zoo.presets.factory import MODEL

ARXIV = re.compile(r"arXiv:(\d{4}\.\d{4,5})")
HEADS = {
    "lm": "causal language model",
    "classifier": "sequence classifier",
    "seq2seq": "encoder-decoder",
    "pair_classifier": "two-tower pair classifier",
}


def card_metadata(info: dict[str, Any], paper: str) -> dict[str, Any]:
    tags = ["transformer-zoo", info["preset"], info["kind"]]
    tags += [f"arxiv:{arxiv_id}" for arxiv_id in ARXIV.findall(paper)]
    if info["kind"] == "lm":
        tags.append("text-generation")
    return {"library_name": "transformer-zoo", "tags": list(dict.fromkeys(tags))}


def cite(paper: str) -> str:
    """ "Dai et al. 2019, Title, arXiv:1901.02860" with the arXiv id linked."""
    return ARXIV.sub(lambda m: f"[arXiv:{m[1]}](https://arxiv.org/abs/{m[1]})", paper) if paper else "(none given)"


def parts(config: dict[str, Any]) -> str:
    """``attention `xl_rel` (mem_len 16, block_size 8), residual `post_norm`, ...``"""

    def one(axis: str) -> str:
        if isinstance(config[axis], list):  # a per-layer hybrid: its parts in layer order, cycled
            return f"{axis} per layer [{'; '.join(one_part(part) for part in config[axis])}]"
        return f"{axis} {one_part(config[axis])}"

    def one_part(value: dict[str, Any]) -> str:
        part = dict(value)
        name = part.pop("name")
        options = ", ".join(f"{k} {v}" for k, v in part.items())
        return f"`{name}`" + (f" ({options})" if options else "")

    axes = [
        axis
        for axis in ("attention", "residual", "stack", "position", "norm", "feed_forward", "init")
        if axis in config
    ]
    if config["kind"] == "seq2seq":
        axes.insert(1, "cross_attention")
    return ", ".join(one(axis) for axis in axes)


def training_text(training: dict[str, Any] | None) -> list[str]:
    if not training:
        return ["Not exported from a training run of this library: training data and metric are not recorded."]
    setting = f"sequence length {training['seq_len']:,}, {training['sequences_per_step']:,} sequences per step"
    line = (
        f"Trained with transformer-zoo on `{training['data']}` for {training['steps']:,} steps ({setting}, "
        f"precision {training.get('precision', 'fp32')}"
        + (f", experiment `{training['experiment']}`" if training.get("experiment") else "")
        + ")."
    )
    lines = [line]
    evaluation, best = training.get("evaluation"), training.get("best")
    if evaluation:
        lines.append(
            f"{evaluation['metric']} = **{evaluation['value']:.4f}** at step {evaluation['step']:,} (the run's latest "
            "evaluation before this checkpoint)."
        )
    if best:
        lines.append(f"Best {best['metric']} of the run: {best['value']:.4f}.")
    return [" ".join(lines)]


def model_card(info: dict[str, Any]) -> str:
    """The README.md of the folder whose ``config.json`` is ``info``."""
    preset = MODEL.get(info["preset"]) if info["preset"] in MODEL else None
    paper = preset.paper if preset else ""
    description = preset.description if preset else "a preset registered outside transformer-zoo"
    config = info["config"]
    metadata = "\n".join(f"{key}: {json.dumps(value)}" for key, value in card_metadata(info, paper).items())
    size = (
        f"{config['n_layers']} layers, d_model {config['d_model']}, {config['n_heads']} heads, d_ff {config['d_ff']}, "
        f"vocabulary {config['vocab_size']:,}"
    )
    rows = [
        ("preset", f"`{info['preset']}`: {description}"),
        ("paper", cite(paper)),
        ("parameters", f"{info['params']:,}"),
        ("head", f"{info['kind']} ({HEADS.get(info['kind'], 'a head of your own')})"),
        ("size", size),
        ("parts", parts(config)),
        ("transformer-zoo", f"{info['zoo_version']} (config format {info['format_version']})"),
    ]
    if info.get("imports"):
        rows.append(("needs", f"your modules {', '.join(info['imports'])}, imported before loading"))
    lines = [
        "---",
        metadata,
        "---",
        "",
        f"# {info['preset']}",
        "",
        "A transformer-zoo model (the efficient / long-context Transformer family on one block skeleton).",
        "",
        "| | |",
        "|---|---|",
        *(f"| {key} | {value} |" for key, value in rows),
        "",
        "## Training",
        "",
        *training_text(info.get("training")),
        "",
        "## Use",
        "",
        "```python",
        "import zoo",
        "",
        'model = zoo.from_pretrained("<this repository or folder>")   # eval mode; .train() to fine-tune',
        "```",
        "",
        "Loading reads `config.json` and `model.safetensors` only: no pickle, and no code from the repository.",
        "",
    ]
    return "\n".join(lines)
