"""Tasks: prompts, a reward, held-out reference text, and task metrics, by name.

:mod:`~elastic_reset.tasks.base` is the registry and knows no task; each task module registers itself, and this
package imports the ones that ship with it.
"""

from elastic_reset.tasks.base import Task, get_task, register_task
from elastic_reset.tasks import helpful, imdb, imdb_gold, prompts, toy, translation, vader  # noqa: F401,E402  (registration)

__all__ = ["Task", "get_task", "register_task"]
