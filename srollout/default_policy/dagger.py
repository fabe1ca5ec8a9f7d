"""DAgger rounds for the default policy: the SFT model plays, the expert labels and steps in.

Why and how (play a β-mixture, β × decay^round; keep the won trajectories; relabel off-label
states; fine-tune with replay): docs/default-policy.md ("A DAgger round"); all seeded."""

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
    counting those that outgrew the context), steps by who acted, off-label model steps, the
    trajectories that outgrew the model's context, and the branch conversations (step 3)."""

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
    """The β-mixture of step 1 behind the engine's Policy protocol: the expert labels every state
    (from ``ActRequest.observation``), then a per-trajectory coin seeded from the request's seed
    lets it play with probability ``beta`` (its label forced into the model's conversation), else
    the model samples its turn in this tick's batch. A trajectory whose next turn would not fit the
    context is played out by the expert and flagged (the engine would stop with an error).
    ``ended`` holds every finished trajectory's record until the caller pops it."""

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
    lm: Any = None,
) -> tuple[list[tuple[str, list[Turn]]], list[tuple[str, list[Turn]]], RoundStats]:
    """One round's rollouts (step 1): ``cfg.correction_G`` trajectories per task, T_max 30, all in
    flight at once, seeded as ``collect`` seeds group ``round_idx * len(tasks) + i`` of run seed
    ``cfg.seed``. Returns the won trajectories and (with ``cfg.correction_relabel``) the branch
    conversations, both as (system prompt, turns) in task then trajectory order, and the counts.
    The model plays through ``lm`` where given (a policy with ``force`` and ``fits``, e.g. a
    :class:`~srollout.policy.vllm_backend.VLLMPolicy` of the same weights), else in process."""
    import time

    from srollout.envs.alfworld_env import AlfworldEnv
    from srollout.policy.experts import ExpertPolicy
    from srollout.policy.transformers_backend import TransformersPolicy
    from srollout.rollout.engine import GroupSpec, RolloutSettings, run_groups
    from srollout.rollout.react import ReactPrompter

    t0 = time.perf_counter()
    if lm is None:
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
        cfg.correction_beta * cfg.correction_beta_decay**round_idx,
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
