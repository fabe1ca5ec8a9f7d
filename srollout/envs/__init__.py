"""Text environments: the TextEnv protocol, ALFWorld on the real engine, generated games, ReAct.

Modules: ``base`` (TextEnv, Task, StepResult), ``alfworld_env`` (AlfworldEnv on the real engine),
``gen`` (game generation), ``tasks`` (named task sets, official data), ``prompts`` (ReAct).
The planner-driven expert policies are :mod:`srollout.policy.experts`; the demonstrations of the
default-policy build, :mod:`srollout.default_policy.demos`. Importing this package does not
import the engine.
"""

from srollout.envs.tasks import load_task_set, task_set_names

__all__ = ["load_task_set", "task_set_names"]
