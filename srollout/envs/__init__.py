"""Text environments: the TextEnv protocol, ALFWorld on the real engine, generated games, ReAct,
the environment registry. Importing this package does not import the engine."""

from srollout.envs.tasks import load_task_set, task_set_names

__all__ = ["load_task_set", "task_set_names"]
