"""The published figures the LRA tables print beside ours (zoo/app/lra.py, zoo/app/lra_speed.py), and
which of their rows is a mechanism's (:func:`paper_row`).

- LRA Table 1 (Tay et al. 2021, "Long Range Arena", arXiv:2011.04006): test accuracy (%) of the eleven
  models on ListOps, Text, Retrieval, Image, Pathfinder, Path-X (FAIL for all) and the average of the first
  five; keyed by the row's name as each mechanism gives it (``Attention.lra_row``).
- LRA Table 2: steps per second and peak memory on Text at 1K-4K, for the rows quoted here.
- The Nyströmformer paper's LRA table (Xiong et al. 2021, arXiv:2102.03902): the models it re-ran in its own
  PyTorch setting (mlpen/Nystromformer LRA/code: 2 layers, d 64).
"""

from __future__ import annotations

from zoo.attention.base import ATTENTION

# LRA Table 1 (test accuracy, %); None = FAIL (chance)
PAPER_TABLE1 = {
    "Transformer": (36.37, 64.27, 57.46, 42.44, 71.40, None, 54.39),
    "Local Attention": (15.82, 52.98, 53.39, 41.46, 66.63, None, 46.06),
    "Sparse Trans.": (17.07, 63.58, 59.59, 44.24, 71.71, None, 51.24),
    "Reformer": (37.27, 56.10, 53.40, 38.07, 68.50, None, 50.67),
}


def _with_average(*cells: float) -> tuple[float | None, ...]:
    """A Table 1 row from its five cells: Path-X FAIL, and the average of the five (as the paper's)."""
    return (*cells, None, round(sum(cells) / len(cells), 2))


PAPER_TABLE1.update(
    {
        "Longformer": _with_average(35.63, 62.85, 56.89, 42.22, 69.71),
        "Linformer": _with_average(35.70, 53.94, 52.27, 38.56, 76.34),
        "Sinkhorn Trans.": _with_average(33.67, 61.20, 53.83, 41.23, 67.45),
        "Synthesizer": _with_average(36.99, 61.68, 54.67, 41.61, 69.45),
        "BigBird": _with_average(36.05, 64.02, 59.29, 40.83, 74.87),
        "Linear Trans.": _with_average(16.13, 65.90, 53.09, 42.34, 75.30),
        "Performer": _with_average(18.01, 65.40, 53.82, 42.77, 77.05),
    }
)
# The Nyströmformer paper's LRA table (Xiong et al. 2021, arXiv:2102.03902), all models re-run in its own
# PyTorch setting (mlpen/Nystromformer LRA/code: 2 layers, d 64): ListOps, Text, Retrieval, Image, Pathfinder;
# Path-X not run. Quoted, not checked against a copy here; each row's average is the mean of its cells.
PAPER_NYSTROMFORMER = {
    "Transformer": _with_average(37.10, 65.02, 79.35, 38.20, 74.16),
    "Reformer": _with_average(19.05, 64.88, 78.64, 43.29, 69.36),
    "Linformer": _with_average(37.25, 55.91, 79.37, 37.84, 67.60),
    "Performer": _with_average(18.80, 63.81, 78.62, 37.07, 69.87),
    "Nyströmformer": _with_average(37.15, 65.52, 79.56, 41.58, 70.94),
}
# LRA Table 2 (Text, TPU v3): steps per second, and peak memory in GB, at 1K, 2K, 3K, 4K
PAPER_TABLE2 = {
    "Transformer": ((8.1, 4.9, 2.3, 1.4), (0.85, 2.65, 5.51, 9.48)),
    "Local Attention": ((9.2, 8.4, 7.4, 7.4), (0.42, 0.76, 1.06, 1.37)),
    "Reformer": ((4.4, 2.2, 1.5, 1.1), (0.48, 0.99, 1.53, 2.28)),
}
PAPER_LENGTHS = (1024, 2048, 3072, 4096)


def paper_row(mechanism: str) -> str | None:
    """The LRA paper's row for ``mechanism``, as the mechanism names it; None for one without a
    counterpart, or one not registered in this process (a plugin whose module was not imported)."""
    return ATTENTION.get(mechanism).lra_row if mechanism in ATTENTION else None


__all__ = ["PAPER_LENGTHS", "PAPER_NYSTROMFORMER", "PAPER_TABLE1", "PAPER_TABLE2", "paper_row"]
