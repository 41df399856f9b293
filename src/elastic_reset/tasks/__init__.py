"""Tasks: prompts, a reward, held-out reference text, and task metrics, by name."""

from elastic_reset.tasks.base import Task, get_task, register_task

__all__ = ["Task", "get_task", "register_task"]
