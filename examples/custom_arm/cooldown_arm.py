"""An arm of your own, in your own package: a pre-rollout skip that srollout runs wherever an arm
name has ``greso``.

``cooldown`` rests a prompt for one iteration after a group of it gave no gradient (zero reward
variance, or cut by the gate), then rolls it out again: GRESO's skip without its draw. Prompt x
is skipped at iteration t iff its last recorded group (of an iteration before t) gave no
gradient and was at iteration t - 1 (``COOLDOWN`` iterations back at most). A skipped prompt
records nothing, so it comes back the iteration after.

srollout finds the part through the entry point in this folder's pyproject.toml (group
``srollout.arms``, name = the part), so after ``pip install ./examples/custom_arm``::

    srollout ab-rollout --arms baseline,greso,cooldown --repeats 2 ...
    srollout train-onpolicy --arms baseline,cooldown ...

run it without a change to srollout. In one process, ``@skip_part("cooldown")`` registers it as
well. docs/extending.md.
"""

from __future__ import annotations

from collections.abc import Iterable

from srollout.core.arms import GresoOutcome, skip_part

COOLDOWN = 1  # iterations a prompt rests after a group without gradient


@skip_part("cooldown")
class CooldownSkipper:
    """The skip of one arm; srollout builds it with the run's seed, the history known before the
    run and GRESO's exploration probability (unused here: the rule draws nothing)."""

    def __init__(
        self, *, seed: int, history: Iterable[GresoOutcome] = (), p_explore: float = 0.0
    ) -> None:
        self._seen: list[GresoOutcome] = []
        for outcome in history:
            self.record(*outcome)

    def record(self, prompt_id: str, iteration: int, zero_var: bool) -> None:
        self._seen.append(GresoOutcome(str(prompt_id), int(iteration), bool(zero_var)))

    def should_skip(self, prompt_id: str, iteration: int) -> bool:
        before = [o for o in self._seen if o.prompt_id == prompt_id and o.iteration < iteration]
        if not before:
            return False
        last = max(before, key=lambda o: o.iteration)
        return last.zero_var and iteration - last.iteration <= COOLDOWN

    def history(self) -> list[GresoOutcome]:
        return list(self._seen)

    def truncate(self, last_iteration: int) -> None:
        self._seen = [o for o in self._seen if o.iteration <= last_iteration]
