"""DAgger rounds for the default policy: the SFT model plays, the expert labels and steps in.

Supervised fine-tuning on expert demonstrations teaches the states the expert visits. A small
model leaves them after its first mistake (an object it thinks it sees, a receptacle it stands
at) and then repeats the mistake, because no demonstration ever showed what to do *there*. A
DAgger round (Ross, Gordon & Bagnell 2011, with a β-mixture of learner and expert) fixes that:

1. roll out G trajectories on ``correction_tasks`` train tasks on the rollout engine
   (:func:`srollout.rollout.engine.run_groups`, the one ``collect`` uses) with a
   :class:`MixturePolicy`: at every step a coin with probability ``correction_beta`` lets the
   expert act, else the model samples its own action (temperature ``correction_temperature``)
   in the tick's batch; either way the expert, told what was really played
   (``ExpertPolicy.played``), labels the state;
2. keep the won trajectories as conversations in the policy's own prompt: the expert's turns and
   the model's turns that equal the label carry loss, the model's other turns stay in the
   context untrained, exactly like the noise turns of the demonstrations, so the model learns
   the way back from its *own* mistakes;
3. with ``correction_relabel``, also teach the label *at* each state where the model went off
   it (of every trajectory that fit the context, won or lost): a branch conversation, the turns
   up to that state untrained, then the state's user turn answered by the label. One sequence
   cannot hold both the model's turn (the context of what follows) and the label at the same
   place, and without the branch the one state DAgger exists for — the model's own mistake, a
   repeat of "take X from Y" after "Nothing happens." above all — never meets its label.
   (Measured: no gain on the v5 model; with the admissible actions in the user template, +3
   points of valid actions over the same round without it. Off by default, see
   ``BuildConfig.correction_relabel`` and docs/benchmarks.md.);
4. fine-tune on them plus ``correction_replay`` original demonstrations (so the rest is not
   forgotten), ``correction_epochs`` epochs at ``correction_lr``.

Everything is seeded from ``BuildConfig.seed`` and the round index: same config, same rounds.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from srollout.default_policy.recipe import BuildConfig
from srollout.envs.base import Task
from srollout.policy.base import ActRequest, ActResponse, TrajectoryTokens, TrajKey
from srollout.policy.chat import Turn

_T_MAX = 30  # the paper's step limit, as collect's default


def demo_response(expert_text: str, thoughts: str) -> str:
    """The expert's ``Thought: ...\nAction: ...`` as the policy is taught to answer: whole, or
    only its ``Action: ...`` line (``thoughts="none"``)."""
    if thoughts != "none":
        return expert_text
    from srollout.envs.prompts import parse_response

    return f"Action: {parse_response(expert_text).action}"


class RoundStats(NamedTuple):
    """What one round played: trajectories (and how many the expert won with the model, not
    counting those that outgrew the context), steps by who acted, the model's steps that
    differed from the expert's label, the trajectories whose next turn would not have fit
    the model's context (the expert played them out; they are not trained on), and the branch
    conversations that teach the label at an off-label state (step 3 of the module docstring)."""

    trajectories: int
    won: int
    model_steps: int
    model_off_label: int
    expert_steps: int
    seconds: float
    past_context: int = 0
    relabelled: int = 0


def round_tasks(tasks: Sequence[Task], cfg: BuildConfig, round_idx: int) -> list[Task]:
    """The train tasks of round ``round_idx``: a seeded sample, a fresh one every round."""
    rng = random.Random(f"srollout-dagger:{cfg.seed}:{round_idx}")
    return rng.sample(list(tasks), min(cfg.correction_tasks, len(tasks)))


class _Mix:
    """One trajectory of a mixture rollout: its coin, its turns so far, the (turn index, label
    text) of every model turn off the label, whether it outgrew the model's context."""

    def __init__(self, seed: int) -> None:
        self.coin = random.Random(seed)
        self.turns: list[Turn] = []
        self.off_label: list[tuple[int, str]] = []
        self.past_context = False


def relabel_branches(
    turns: Sequence[Turn], off_label: Sequence[tuple[int, str]]
) -> list[list[Turn]]:
    """Step 3 of the module docstring: for each (turn index j, label text), the conversation
    ``turns[:j]`` with no turn trained, then turn j's user turn answered by the label (trained)."""
    return [
        [t._replace(trained=False) for t in turns[:j]] + [Turn(turns[j].user, label, True)]
        for j, label in off_label
    ]


class MixturePolicy:
    """The β-mixture of step 1 behind the engine's Policy protocol.

    For every request the expert labels the state (it reads ``ActRequest.observation``, so the
    user turn can be in the model's own template); a per-trajectory coin seeded from the
    request's seed then lets the expert play with probability ``beta`` (its label is forced into
    the model's conversation, :meth:`TransformersPolicy.force`), else the model samples its turn
    in the batch of this tick. Each turn is recorded as the model is to be taught it (see the
    module docstring). A trajectory whose next turn would not fit the model's context is played
    out by the expert and flagged, not trained on: the rollout engine would stop with an error.
    ``ended`` holds every finished trajectory's record (turns, off-label turns, past_context)
    until the caller pops it.
    """

    def __init__(self, model: Any, expert: Any, beta: float, thoughts: str) -> None:
        self.model = model
        self.expert = expert
        self.beta = float(beta)
        self.thoughts = thoughts
        self.name = f"mixture(beta={beta:g})"
        self.ended: dict[TrajKey, _Mix] = {}
        self.model_steps = self.model_off_label = self.expert_steps = 0
        self._trajs: dict[TrajKey, _Mix] = {}

    def act(self, requests: list[ActRequest]) -> list[ActResponse]:
        from srollout.envs.prompts import parse_response

        out: list[ActResponse | None] = [None] * len(requests)
        to_model: list[tuple[int, str, str]] = []
        for i, req in enumerate(requests):
            if req.step == 1 or req.key not in self._trajs:
                self._trajs[req.key] = _Mix(req.seed)
            traj = self._trajs[req.key]
            text = self.expert.act([req])[0].text
            label, label_text = parse_response(text).action, demo_response(text, self.thoughts)
            if not traj.past_context and not self.model.fits(req):
                traj.past_context = True
                self.model.finish(req.key)
            if traj.past_context:
                out[i] = ActResponse(label_text)
            elif traj.coin.random() < self.beta:
                self.model.force(req, label_text)
                traj.turns.append(Turn(req.user, label_text, True))
                self.expert_steps += 1
                out[i] = ActResponse(label_text)
            else:
                to_model.append((i, label, label_text))
        responses = self.model.act([requests[i] for i, _, _ in to_model]) if to_model else []
        for (i, label, label_text), resp in zip(to_model, responses, strict=True):
            on_label = parse_response(resp.text).action == label
            traj = self._trajs[requests[i].key]
            if not on_label:
                traj.off_label.append((len(traj.turns), label_text))
            traj.turns.append(
                Turn(requests[i].user, label_text if on_label else resp.text, on_label)
            )
            self.model_steps += 1
            self.model_off_label += not on_label
            out[i] = resp
        for req, resp in zip(requests, out, strict=True):
            # the expert reads its next observation as the outcome of what was really played
            self.expert.played(req.key, parse_response(resp.text).action, req.admissible)
        return out  # type: ignore[return-value]

    def finish(self, key: TrajKey) -> TrajectoryTokens | None:
        self.expert.finish(key)
        traj = self._trajs.pop(key, None)
        if traj is not None:
            self.ended[key] = traj
        return self.model.finish(key)


def play_round(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[Task],
    system: str,
    cfg: BuildConfig,
    round_idx: int,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[tuple[str, list[Turn]]], list[tuple[str, list[Turn]]], RoundStats]:
    """One round's rollouts (step 1 of the module docstring) on the rollout engine: G =
    ``cfg.correction_G`` trajectories per task, T_max 30, every trajectory in flight at once,
    seeded as ``collect`` seeds group ``round_idx * len(tasks) + i`` of run seed ``cfg.seed``.

    Returns the won trajectories and, with ``cfg.correction_relabel``, the branch conversations
    of step 3 (both as (system prompt, turns), in task then trajectory order), and the round's
    counts; calls ``progress(trajectories finished, total)``.
    """
    import time

    from srollout.envs.alfworld_env import AlfworldEnv
    from srollout.policy.experts import ExpertPolicy
    from srollout.policy.transformers_backend import TransformersPolicy
    from srollout.rollout.engine import GroupSpec, RolloutSettings, run_groups
    from srollout.rollout.react import ReactPrompter

    t0 = time.perf_counter()
    lm = TransformersPolicy(
        "in-memory",
        model=model,
        tokenizer=tokenizer,
        temperature=cfg.correction_temperature,
        max_new_tokens=48,
        max_batch_rows=128,
    )
    mix = MixturePolicy(
        lm,
        ExpertPolicy(seed=cfg.seed, explore=cfg.explore, take=cfg.take),
        cfg.correction_beta,
        cfg.thoughts,
    )
    G = cfg.correction_G
    specs = [GroupSpec(round_idx * len(tasks) + i, task) for i, task in enumerate(tasks)]
    settings = RolloutSettings(
        G=G, T_max=_T_MAX, seed=cfg.seed, concurrency=max(G, G * len(tasks)), signal_K=()
    )
    won: list[tuple[int, int, list[Turn]]] = []
    branches: list[tuple[int, int, list[Turn]]] = []
    done = past = 0

    def on_group(group: Any) -> None:
        nonlocal done, past
        for rec in group.trajs:
            traj = mix.ended.pop(TrajKey(group.group_id, rec.traj_idx))
            past += traj.past_context
            if traj.past_context:
                continue
            if rec.success:
                won.append((group.spec.index, rec.traj_idx, traj.turns))
            if cfg.correction_relabel:
                branches.extend(
                    (group.spec.index, rec.traj_idx, b)
                    for b in relabel_branches(traj.turns, traj.off_label)
                )
        done += G
        if progress is not None:
            progress(done, len(specs) * G)

    run_groups(
        specs,
        mix,
        lambda: AlfworldEnv(expert_plan=True),
        ReactPrompter(system, cfg.user_template),
        settings,
        on_group=on_group,
    )
    stats = RoundStats(
        len(specs) * G,
        len(won),
        mix.model_steps,
        mix.model_off_label,
        mix.expert_steps,
        time.perf_counter() - t0,
        past,
        len(branches),
    )

    # groups finish in scheduling order; the round's conversations are returned in task order
    def ordered(convs: list[tuple[int, int, list[Turn]]]) -> list[tuple[str, list[Turn]]]:
        return [(system, turns) for _, _, turns in sorted(convs, key=lambda c: c[:2])]

    return ordered(won), ordered(branches), stats
