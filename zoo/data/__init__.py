"""Tasks and loaders: synthetic long-range tasks (built in, no download) and real text/data by path.

``create_task(name, batch_size=, seq_len=, seed=, **options)`` builds a registered task;
``list_tasks()`` lists them. Every module of this package is imported (its tasks registered) when
the package is.
"""

from zoo.data.base import TASK, DataFileNotFound, Task, create_task, list_tasks, metric_value
from zoo.registry import import_submodules

import_submodules(__name__)

__all__ = ["TASK", "DataFileNotFound", "Task", "create_task", "list_tasks", "metric_value"]
