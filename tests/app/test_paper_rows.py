"""Paper rows of the gated linear and state-space family (conf/experiment/paper_rows/*.yaml): each builds
(on the meta device: shapes only) to the parameter count of the official configuration it names, part by
part, every difference accounted for exactly.

The official configurations are flash-linear-attention's (commit bc3b101d, ``$ZOO_REFERENCES``): the GLA
rows' JSON files, the other models' configuration defaults (read from the source with ``ast``: the fla
package imports triton, which a CPU machine lacks). Its models cannot be built here for the same reason, so
their counts are computed from those configurations by the fla layers' own module structure, written out
below with the file each term comes from (``fla/layers/*.py``, ``fla/modules/mlp.py``,
``fla/models/*/modeling_*.py``). Mamba-2's reference is built for real: HF transformers'
``Mamba2ForCausalLM`` at fla's Mamba2Config sizes, on the meta device. Skipped where a reference is absent.
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.parts.references import REFERENCES
from zoo.app.compose import compose
from zoo.app.paper import meta_model, model_config_for, params_within
from zoo.app.resolve import as_dict

FLA = REFERENCES / "flash-linear-attention"
ROWS_DIR = Path(__file__).resolve().parents[2] / "conf" / "experiment" / "paper_rows"
ROWS = sorted(p.stem for p in ROWS_DIR.glob("*.yaml"))
FAST = "gla_340m"  # the default run checks one row (about a second each: compose + meta build); the rest are slow


def init_defaults(path: Path, class_name: str | None = None) -> dict[str, Any]:
    """The keyword defaults of ``__init__`` in ``path`` (of ``class_name``, or the file's first class)."""
    if not path.is_file():
        pytest.skip(f"flash-linear-attention not fetched: {path} is missing (set ZOO_REFERENCES)")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and class_name in (None, node.name):
            init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
            args = init.args.args[-len(init.args.defaults) :]
            return {a.arg: literal(d) for a, d in zip(args, init.args.defaults, strict=True)}
    raise LookupError(f"{class_name} not in {path}")


def literal(node: ast.expr) -> Any:
    """A default's value; one that is not a literal (``float("inf")``) as its source text."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def official_config(row: str) -> dict[str, Any]:
    """The official configuration a row names: JSON over the fla config class's defaults."""
    model = {"gla": "gla", "deltanet": "delta_net", "gated": "gated_deltanet", "retnet": "retnet", "mamba2": "mamba2"}
    folder = model[row.split("_")[0]]
    config = init_defaults(next((FLA / "fla" / "models" / folder).glob("configuration_*.py"), FLA / "missing.py"))
    if row.startswith("gla_"):
        size = {"gla_340m": "340M", "gla_1b3": "1B"}[row]
        path = FLA / "legacy" / "training" / "configs" / f"gla_{size}.json"
        if not path.is_file():
            pytest.skip(f"flash-linear-attention not fetched: {path} is missing")
        config.update(json.loads(path.read_text()))
    return config


def gated_mlp(d: int, ratio: int, intermediate: int | None) -> int:
    """fla/modules/mlp.py GatedMLP: gate, up, down; width 2/3 x ratio x d rounded up to 256 unless given."""
    if intermediate is None:
        intermediate = 256 * -(-int(d * ratio * 2 / 3) // 256)
    return 3 * d * intermediate


def fla_mixer(row: str, c: dict[str, Any]) -> int:
    """One mixer layer of the fla model at config ``c``, term by term as its layer's __init__ builds it."""
    d = c["hidden_size"]
    if row.startswith("gla_"):  # fla/layers/gla.py GatedLinearAttention (no short conv, output gate, fused norm)
        rank = init_defaults(FLA / "fla" / "layers" / "gla.py", "GatedLinearAttention")["gate_low_rank_dim"]
        k, v = int(d * c["expand_k"]), int(d * c["expand_v"])
        return d * k + d * k + d * v + d * v + (d * rank + rank * k + k) + v * d + v // c["num_heads"]
    if row.startswith("deltanet_"):  # fla/layers/delta_net.py DeltaNet (beta, short convs, no gate: RMSNorm)
        k, v, h = int(d * c["expand_k"]), int(d * c["expand_v"]), c["num_heads"]
        return 2 * d * k + d * v + d * h + (2 * k + v) * c["conv_size"] + v // h + v * d
    if row.startswith("gated_deltanet_"):  # fla/layers/gated_deltanet.py GatedDeltaNet
        h, k_head = c["num_heads"], c["head_dim"]
        k, v_head = h * k_head, int(k_head * c["expand_v"])
        v = h * v_head
        convs = (2 * k + v) * c["conv_size"]
        return 2 * d * k + d * v + 2 * d * h + 2 * h + convs + d * v + v_head + v * d  # q k v a b A dt conv g norm o
    if row.startswith("retnet_"):  # fla/layers/multiscale_retention.py MultiScaleRetention (gate, fused norm)
        k, v = int(d * c["expand_k"]), int(d * c["expand_v"])
        return 2 * d * k + 2 * d * v + v * d + v // c["num_heads"]
    raise LookupError(row)


def fla_parts(row: str, c: dict[str, Any]) -> dict[str, int]:
    """The fla model's parameters by part (fla/models/*/modeling_*.py: embeddings, per block attn_norm +
    mixer + mlp_norm + GatedMLP, final norm, lm_head unless tied)."""
    d, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    return {
        "embedding": vocab * d,
        "head": 0 if c["tie_word_embeddings"] else vocab * d,
        "norms": (2 * layers + 1) * d,
        "mixers": layers * fla_mixer(row, c),
        "feed_forwards": layers * gated_mlp(d, c["hidden_ratio"], c["intermediate_size"]),
    }


def hf_mamba2_parts(c: dict[str, Any]) -> dict[str, int]:
    """HF transformers' Mamba2ForCausalLM at fla's Mamba2Config sizes, built on the meta device."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Mamba2Config(
        vocab_size=c["vocab_size"],
        hidden_size=c["hidden_size"],
        state_size=c["state_size"],
        num_hidden_layers=c["num_hidden_layers"],
        expand=c["expand"],
        conv_kernel=c["conv_kernel"],
        n_groups=c["n_groups"],
        head_dim=c["head_dim"],
        num_heads=c["expand"] * c["hidden_size"] // c["head_dim"],
        use_bias=c["use_bias"],
        use_conv_bias=c["use_conv_bias"],
        tie_word_embeddings=c["tie_word_embeddings"],
    )
    with torch.device("meta"):
        model = transformers.Mamba2ForCausalLM(config)
    return split_parts(model.named_parameters(), HF_MAMBA2_PARTS)


# part -> a marker in its parameters' names; the first part whose marker a name contains takes it
OUR_PARTS = dict(mixers=".attention.", feed_forwards=".feed_forward.", embedding="embed.", head="head.", norms="norm")
HF_MAMBA2_PARTS = dict(mixers=".mixer.", feed_forwards="\0", embedding="embeddings", head="lm_head", norms="norm")


def split_parts(named, markers: dict[str, str]) -> dict[str, int]:
    """Parameter counts by part (``markers``, in order); a tied table counts once."""
    parts = dict.fromkeys(markers, 0)
    seen: set[int] = set()
    for name, p in named:
        if id(p) not in seen:
            seen.add(id(p))
            parts[next(part for part, marker in markers.items() if marker in name)] += p.numel()
    return parts


@functools.cache
def resolved(row: str) -> dict[str, Any]:
    return as_dict(compose([f"experiment=paper_rows/{row}"]))


def our_parts(row: str) -> dict[str, int]:
    """Our model at the row's configuration, as the app builds it (on the meta device), by part."""
    _, config, _ = model_config_for(resolved(row))
    model = meta_model(config)
    return split_parts(model.named_parameters(), OUR_PARTS)


def explained(row: str, c: dict[str, Any]) -> dict[str, int]:
    """Ours minus the reference, by part, each term a deviation the row's paper.params_note states."""
    d, layers = c["hidden_size"], c["num_hidden_layers"]
    if row.startswith("gated_deltanet_"):  # 8 heads of 192 for fla's 6 of 256 (n_heads must divide d_model)
        heads = (8 - c["num_heads"]) * (2 * d + 2)  # a_proj, b_proj rows; A_log, dt_bias
        norm = 2 * 192 - int(c["head_dim"] * c["expand_v"])  # the output norm is per value head
        return {"mixers": layers * (heads + norm)}
    if row.startswith("retnet_"):  # the paper's group norm has no affine weight; fla's norm has one
        return {"mixers": -layers * int(d * c["expand_v"]) // c["num_heads"]}
    return {}


@pytest.mark.parametrize("row", [r if r == FAST else pytest.param(r, marks=pytest.mark.slow) for r in ROWS])
def test_paper_row_counts_match_the_official_config(row):
    config = official_config(row)
    if row.startswith("mamba2_"):
        reference = hf_mamba2_parts(config)
        ours = our_parts(row)
        # 21 blocks of mixer + SwiGLU for the paper's 48 mixer-only blocks: each mixer equal, depth differs
        per_mixer = reference["mixers"] // config["num_hidden_layers"]
        assert ours["mixers"] == 21 * per_mixer
        assert ours["norms"] == (2 * 21 + 1) * config["hidden_size"]
        assert reference["norms"] == (config["num_hidden_layers"] + 1) * config["hidden_size"]
        assert ours["feed_forwards"] == 21 * gated_mlp(config["hidden_size"], 4, None)
    else:
        reference = fla_parts(row, config)
        ours = our_parts(row)
        gap = explained(row, config)
        assert {k: ours[k] - reference[k] for k in ours} == {k: gap.get(k, 0) for k in ours}
    assert ours["embedding"] == reference["embedding"] and ours["head"] == reference["head"]
    paper = resolved(row)["paper"]
    assert paper["reference_params"] == sum(reference.values()), "the row's reference_params is the reference's count"
    ok, message = params_within(paper, sum(ours.values()))
    assert ok, f"{row}: {message}"
