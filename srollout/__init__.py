"""srollout: selective rollout for GRPO on multi-turn agents.

Stop a group of G trajectories at step K when they already agree so much that the group will
almost surely have zero reward variance (and so zero GRPO gradient). The pure algorithm lives in
:mod:`srollout.core` and imports neither torch nor any engine.
"""

__version__ = "0.1.0"
