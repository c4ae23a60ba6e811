"""Studies: each reproduction a registered part (``base.py``: the contract; ``common.py``: what they
share), one file per study, registered when this package is imported.

    python experiments/study.py study=alibi_extrapolation study.steps=1000
    python experiments/study.py study=alibi_extrapolation report_only=true   # re-render from rows.csv
"""

from zoo.registry import import_submodules
from zoo.studies.base import STUDY, Study, StudyPaths, create_study

import_submodules(__name__)

__all__ = ["STUDY", "Study", "StudyPaths", "create_study"]
