"""Tasks and loaders: synthetic long-range tasks (built in, no download) and real text/data by path.

``create_task(name, batch_size=, seq_len=, seed=, **options)`` builds a registered task;
``list_tasks()`` lists them. Importing this package registers every task.
"""

# imported for their registration side effects
from zoo.data import aan, images, imdb, listops, pathfinder, synthetic, text, word  # noqa: F401
from zoo.data.base import TASK, DataFileNotFound, Task, create_task, list_tasks, metric_value

__all__ = ["TASK", "DataFileNotFound", "Task", "create_task", "list_tasks", "metric_value"]
