"""Fine-tuning tasks, one module each: its reader, features, task object (how batches are made, scored and
saved), head and metric; `table.py` is the one table of them (name, module, settings, help). Pretraining is
`pretraining.build`, which takes prepared shards instead of labelled files.

This package's own namespace imports no torch (the CLI reads the table); import a task's module for its code.
"""

from .table import LABELLED, TASKS, TaskSpec, task_spec

__all__ = ["LABELLED", "TASKS", "TaskSpec", "task_spec"]
