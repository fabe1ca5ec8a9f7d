"""Your own multi-turn text environment through srollout's engine: a key-room game written here,
registered here, rolled out by `collect` with the shipped policy, and (``--trl-steps``) trained
through TRL's GRPOTrainer with the gate.

    python examples/your_own_environment.py [--groups 8] [--G 4] [--T-max 16] [--K 5]
    python examples/your_own_environment.py --trl-steps 1        # also one TRL GRPO step
    srollout collect --env examples.your_own_environment:KEY_ROOM --quick   # the same env, CLI

The game: a room of drawers, shelves and a safe; a keychain lies in one of them (closed drawers
must be opened first). The task is "put a keychain in safe."; reward 1 on the step the keychain
goes into the open safe, and the episode is over. A lost episode simply runs to T_max. The game
speaks ALFWorld's action dialect (``go to drawer 2``, ``open drawer 2``, ``take keychain 1 from
drawer 2``, ``move keychain 1 to safe 1``) only so that the shipped policy, fine-tuned on
ALFWorld, wins some episodes and loses others; your environment speaks its own. Everything
srollout needs is the :class:`EnvSpec` at the bottom: a ``make_env`` (the TextEnv protocol:
``reset(task, seed) -> (observation, StepResult)``, ``step(action) -> StepResult``, ``close()``)
and the task sets; the prompt and the parser are srollout's ReAct defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

from srollout.envs.base import NOTHING_HAPPENS, StepResult, Task
from srollout.envs.registry import EnvSpec, register_env
from srollout.errors import SrolloutError

KEY, SAFE = "keychain 1", "safe 1"


class KeyRoom:
    """The TextEnv: where the agent stands, what is open, where the keychain is."""

    def __init__(self) -> None:
        self.task: Task | None = None

    def reset(self, task: Task, seed: int) -> tuple[str, StepResult]:
        # The game is deterministic per task; ``seed`` (the trajectory's env seed) is unused.
        self.task = task
        self.places: list[str] = list(task.meta["places"])
        self.key_at = task.meta["key_at"]  # a place, or "hand"
        self.opened = {p for p in self.places if p.startswith("shelf")}
        self.at = ""
        listing = ", ".join(f"a {p}" for p in self.places[:-1]) + f", and a {self.places[-1]}"
        text = (
            f"You are in the middle of a room. Looking quickly around you, you see {listing}.\n\n"
            f"Your task is to: {task.task_text}"
        )
        return text, self._result(text, 0.0, False, True)

    def step(self, action: str) -> StepResult:
        a = action.replace("put ", "move ").replace(" in/on ", " to ").replace(" in ", " to ")
        if a not in self.admissible():
            return self._result(NOTHING_HAPPENS, 0.0, False, False)
        verb, _, rest = a.partition(" ")
        if a.startswith("go to "):
            self.at = a[6:]
            text = f"You arrive at {self.at}. " + (
                f"The {self.at} is closed." if self.at not in self.opened else self._inside()
            )
        elif verb == "open":
            self.opened.add(rest)
            seen = f"a {KEY}" if self.key_at == rest else "nothing"
            text = f"You open the {rest}. The {rest} is open. In it, you see {seen}."
        elif verb == "close":
            self.opened.discard(rest)
            text = f"You close the {rest}."
        elif verb == "take":
            self.key_at = "hand"
            text = f"You pick up the {KEY} from the {self.at}."
        elif verb == "move":
            self.key_at = self.at
            won = self.at == SAFE
            return self._result(f"You move the {KEY} to the {self.at}.", float(won), won, True)
        elif a == "inventory":
            text = f"You are carrying: a {KEY}." if self.key_at == "hand" else "You carry nothing."
        else:  # look
            text = f"You are facing the {self.at}." if self.at else "You are in the middle."
        return self._result(text, 0.0, False, True)

    def close(self) -> None:
        self.task = None

    # --- the state's admissible actions and the planner's plan (expert policies read it)
    def _inside(self) -> str:
        seen = f"a {KEY}" if self.key_at == self.at else "nothing"
        return f"On the {self.at}, you see {seen}." if self.at else ""

    def admissible(self) -> tuple[str, ...]:
        out = [f"go to {p}" for p in self.places if p != self.at] + ["look", "inventory"]
        if self.at and not self.at.startswith("shelf"):
            out.append(("close " if self.at in self.opened else "open ") + self.at)
        if self.at in self.opened and self.key_at == self.at:
            out.append(f"take {KEY} from {self.at}")
        if self.at in self.opened and self.key_at == "hand":
            out.append(f"move {KEY} to {self.at}")
        return tuple(out)

    def plan(self) -> tuple[str, ...]:
        steps, at = [], self.at
        for place, act in ((self.key_at, f"take {KEY} from {self.key_at}"), (SAFE, None)):
            if place == "hand":
                continue
            if at != place:
                steps.append(f"go to {place}")
                at = place
            if place not in self.opened:
                steps.append(f"open {place}")
            steps.append(act or f"move {KEY} to {SAFE}")
        return tuple(steps)

    def _result(self, text: str, reward: float, done: bool, valid: bool) -> StepResult:
        plan = () if done else self.plan()
        return StepResult(text, reward, done, valid, () if done else self.admissible(), plan)


def make_tasks(split: str) -> list[Task]:
    """``train`` (16 tasks), ``eval`` (8) and ``heldout`` (8): 1-3 drawers, 0-1 shelf and the
    safe, listed in a shuffled order; the keychain in a drawer or on the shelf."""
    sizes = {"train": 16, "eval": 8, "heldout": 8}
    if split not in sizes:
        raise SrolloutError(f"key-room has task sets {', '.join(sizes)}, not {split!r}")
    rng = random.Random(f"key-room/{split}")
    tasks = []
    for i in range(sizes[split]):
        places = [f"drawer {d}" for d in range(1, rng.randint(1, 3) + 1)]
        places += ["shelf 1"] * rng.randint(0, 1) + [SAFE]
        key_at = rng.choice(places[:-1])
        rng.shuffle(places)
        kind = "key_on_shelf" if key_at.startswith("shelf") else "key_in_drawer"
        meta = {"places": places, "key_at": key_at}
        tasks.append(Task(f"{split}/{i:03d}", kind, "put a keychain in safe.", "", meta=meta))
    return tasks


KEY_ROOM = register_env(
    EnvSpec(
        name="key-room",
        make_env=KeyRoom,
        tasks=make_tasks,
        description="find the keychain in a drawer or on a shelf, put it in the safe",
    )
)


def collect(args: argparse.Namespace) -> dict:
    """`srollout collect --env key-room` through the library, then what a gate at K would cut,
    judged by each group's full outcome."""
    import polars as pl

    from srollout.config import CollectConfig
    from srollout.stages.collect import run_collect

    config = CollectConfig(
        env="key-room",
        tasks="eval",
        groups=args.groups,
        G=args.G,
        T_max=args.T_max,
        seed=args.seed,
        policy=args.policy,
        signal_K=(args.K,),
        out=Path(args.out) / "collect",
        concurrency=max(64, args.G),
    )
    result = run_collect(config, progress=False)
    groups = pl.read_parquet(result.paths["groups"])
    trajs = pl.read_parquet(result.paths["trajectories"])
    signals = pl.read_parquet(result.paths["signals"]).filter(pl.col("K") == args.K)
    cut = signals.filter(pl.col("prefix_edit_distance_mean") < args.d_L)
    summary = {
        "env": json.loads((result.run_dir / "manifest.json").read_text())["config"]["env"],
        "groups": groups.height,
        "trajectories": trajs.height,
        "labels": {
            k: int((groups["label"] == k).sum()) for k in ("all_fail", "mixed", "all_succeed")
        },
        "wins": int(trajs["success"].sum()),
        "env_steps": int(trajs["n_steps"].sum()),
        "gate": {"K": args.K, "d_L": args.d_L},
        "would_cut": cut.height,
        "would_cut_mixed": int((cut["label"] == "mixed").sum()),
        "run_dir": str(result.run_dir),
    }
    print(
        f"key-room: {summary['groups']} groups of G={args.G}: "
        + ", ".join(f"{k} {v}" for k, v in summary["labels"].items())
        + f"; {summary['wins']} of {summary['trajectories']} trajectories won; "
        f"{summary['env_steps']} env steps"
    )
    print(
        f"gate r1 at K={args.K}, d_L={args.d_L}: would cut {summary['would_cut']} groups "
        f"(of which {summary['would_cut_mixed']} mixed: cut although they had reward variance)"
    )
    print(f"run directory: {result.run_dir}")
    return summary


def train_with_trl(args: argparse.Namespace) -> dict:
    """``--trl-steps N`` GRPO steps of TRL's GRPOTrainer on key-room's train set, srollout's engine
    as its ``rollout_func`` with the gate at K (as in examples/trl_grpo_alfworld.py, on CPU)."""
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig, GRPOTrainer

    from srollout.core.gate import GateRule
    from srollout.integrations.trl import GatedRollout
    from srollout.policy import resolve_model

    rollout = GatedRollout.from_env(
        "key-room",
        "train",
        G=args.G,
        gate=GateRule("r1", K=args.K, d_L=args.d_L),
        T_max=args.T_max,
        seed=args.seed,
        max_new_tokens=48,
    )
    config = GRPOConfig(
        output_dir=str(Path(args.out) / "trl"),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        num_generations=args.G,
        per_device_train_batch_size=args.G * 2,
        max_steps=args.trl_steps,
        learning_rate=1e-4,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=str(resolve_model("default")),
        args=config,
        reward_funcs=rollout.reward,
        train_dataset=rollout.dataset(repeats=args.trl_steps),
        rollout_func=rollout,
    )
    trainer.train()
    c = rollout.counts
    summary = {"steps": args.trl_steps, "groups": c.groups, "cut": c.cut, "env_steps": c.env_steps}
    print(
        f"TRL: {args.trl_steps} GRPO step(s), {c.groups} groups rolled out on key-room, "
        f"{c.cut} cut at K={args.K}, {c.env_steps} env steps, {c.gen_tokens} tokens generated"
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/your-own-environment", help="must not exist")
    parser.add_argument("--groups", type=int, default=8, help="groups (eval tasks, repeated)")
    parser.add_argument("--G", type=int, default=4, help="trajectories per group")
    parser.add_argument("--T-max", type=int, default=16, help="step limit per trajectory")
    parser.add_argument("--K", type=int, default=5, help="gate step")
    parser.add_argument("--d-L", type=float, default=0.4, help="cut when d_K < d_L")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", default="lm", help="lm (the shipped policy) or expert")
    parser.add_argument("--trl-steps", type=int, default=0, help="then N TRL GRPO steps (0: none)")
    args = parser.parse_args()
    if Path(args.out).exists():
        sys.exit(f"{args.out} exists; give a new --out (nothing is overwritten)")
    summary = {"collect": collect(args)}
    if args.trl_steps:
        summary["trl"] = train_with_trl(args)
    Path(args.out, "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
