"""Benchmark the ALFWorld environments on the real engine; write docs/bench/envs.md.

    python benchmarks/bench_envs.py [--games 40] [--out docs/bench/envs.md]

On the default games (``small``), ``medium`` games and the largest layouts (FloorPlan 9 and
30, all 47 receptacles, 3 distractors) it measures, in one process, side by side:

- generation: wall-clock per planner-checked game of ``load_task_set`` into an empty cache;
- group reset: resetting G=8 environments on one task, cold (task never seen by the process)
  and warm (the parsed game is cached, environments reused), with the target <= 1 s;
- step: median / p90 of ``env.step`` over expert episodes, with the per-step replan
  (``expert_plan=True``) and without (what LLM rollouts use), target median <= 20 ms;
- memory: resident-set growth per environment (64 environments reset on 8 tasks);
- the stock textworld engine (``PddlEnv`` + ALFWorld wrappers) on the small games, for the ratio.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    """Resident set size of this process, MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def small_tasks(n: int) -> list:
    from srollout.envs.tasks import load_task_set

    return load_task_set("eval", difficulty="small", n=n, progress=False)


def medium_tasks(n: int) -> list:
    from srollout.envs.tasks import load_task_set

    return load_task_set("eval", difficulty="medium", n=n, progress=False)


def largest_tasks(n: int) -> list:
    """Games in the two largest layouts (FloorPlan 9 and 30: 47 receptacles each), every
    receptacle kept, the default 3 distractors; planner-checked like the task sets."""
    from srollout.envs.gen import Difficulty, generate_game
    from srollout.envs.tasks import _task_from, solve_check

    types = (
        "pick_and_place_simple",
        "pick_clean_then_place_in_recep",
        "pick_heat_then_place_in_recep",
        "pick_cool_then_place_in_recep",
    )
    out = []
    for i in range(n):
        spec = generate_game(types[i % len(types)], i, Difficulty(0, 3), floorplans=(9, 30))
        walk = solve_check(spec)
        if walk:
            out.append(
                _task_from(
                    spec.task_type,
                    spec.task_text,
                    spec.pddl_problem,
                    walk,
                    f"largest/{i}",
                    "",
                    floorplan=spec.floorplan,
                )
            )
    return out


def bench(name: str, make_tasks, n_games: int, stock: bool) -> dict:
    from srollout.envs import alfworld_env as aw

    def say(msg: str) -> None:
        print(f"[{name}] {msg}", flush=True)

    out: dict = {"name": name}
    t0 = time.perf_counter()
    tasks = make_tasks(n_games)
    out["gen_s_per_game"] = (time.perf_counter() - t0) / n_games
    out["n"] = len(tasks)
    out["receptacles"] = statistics.mean(
        t.meta["pddl_problem"].split("(:objects", 1)[1].split(")", 1)[0].count(" - receptacle")
        for t in tasks
    )
    out["walkthrough_len"] = statistics.mean(len(t.meta["walkthrough"]) for t in tasks)
    say(f"generated {len(tasks)} games, {out['gen_s_per_game']:.2f} s/game")

    # group reset: cold = first time this process sees the task (shared-game cache cleared)
    cold, warm = [], []
    envs = [aw.AlfworldEnv(expert_plan=False) for _ in range(8)]
    for task in tasks[:10]:
        aw._GAME_CACHE.clear()
        t0 = time.perf_counter()
        for e in envs:
            e.reset(task, 0)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for e in envs:
            e.reset(task, 1)
        warm.append(time.perf_counter() - t0)
    for e in envs:
        e.close()
    out["group8_reset_cold_s"] = statistics.median(cold)
    out["group8_reset_warm_s"] = statistics.median(warm)
    say(
        f"group reset cold {out['group8_reset_cold_s']:.3f} s, warm "
        f"{out['group8_reset_warm_s']:.3f} s"
    )

    # steps: a few admissible detours then the walkthrough, without and with the replan
    for plan_on in (False, True):
        env = aw.AlfworldEnv(expert_plan=plan_on)
        times = []
        for task in tasks[:20]:
            _, info = env.reset(task, 0)
            for a in list(info.admissible[:3]) + list(task.meta["walkthrough"]):
                t0 = time.perf_counter()
                env.step(a)
                times.append(time.perf_counter() - t0)
        env.close()
        key = "plan" if plan_on else "noplan"
        out[f"step_median_ms_{key}"] = 1000 * statistics.median(times)
        out[f"step_p90_ms_{key}"] = 1000 * pct(times, 0.9)
        say(f"step ({key}) median {out[f'step_median_ms_{key}']:.1f} ms")

    # memory per environment: 32 envs (4 groups of 8) reset and stepped once
    before = rss_mb()
    many = []
    for g in range(4):
        for _ in range(8):
            e = aw.AlfworldEnv(expert_plan=False)
            e.reset(tasks[g % len(tasks)], 0)
            e.step("look")
            many.append(e)
    out["rss_mb_per_env"] = (rss_mb() - before) / len(many)
    for e in many:
        e.close()
    say(f"RSS per env {out['rss_mb_per_env']:.1f} MiB")

    if stock:  # the stock engine on the same games (textworld PddlEnv + ALFWorld wrappers)
        eng = aw._engine()
        infos = eng.textworld.EnvInfos(
            won=True, admissible_commands=True, policy_commands=True, extras=["gamefile"]
        )
        env = eng.AlfredInfos(eng.AlfredDemangler(eng.PddlEnv(infos)))
        loads, steps = [], []
        for task in tasks[:4]:
            game = aw.game_dict(task)
            t0 = time.perf_counter()
            with aw._keep_argv():
                env.load(game)
                env.reset()
            loads.append(time.perf_counter() - t0)
            for a in task.meta["walkthrough"]:
                t0 = time.perf_counter()
                with aw._keep_argv():
                    env.step(a)
                steps.append(time.perf_counter() - t0)
        out["stock"] = (statistics.median(loads), 1000 * statistics.median(steps))
        say(f"stock engine load+reset {out['stock'][0]:.2f} s, step {out['stock'][1]:.1f} ms")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--games", type=int, default=40, help="games per difficulty")
    ap.add_argument("--largest", type=int, default=4, help="games in the largest layouts")
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench" / "envs.md"))
    args = ap.parse_args()

    os.environ["SROLLOUT_HOME"] = tempfile.mkdtemp(prefix="bench-envs-")
    t0 = time.perf_counter()
    from srollout.envs import alfworld_env as aw

    aw._engine()
    import_s = time.perf_counter() - t0
    rows = [
        bench("small (default)", small_tasks, args.games, stock=True),
        bench("medium", medium_tasks, max(4, args.games // 4), stock=False),
        bench("largest layouts", largest_tasks, args.largest, stock=False),
    ]

    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    lines = [
        "# Environment benchmark (ALFWorld, real engine)",
        "",
        f"{date} — {machine} — `python benchmarks/bench_envs.py --games {args.games} "
        f"--largest {args.largest}`",
        "",
        f"Engine import (textworld + alfworld + fast-downward): {import_s:.2f} s.",
        "",
        "| games | n | receptacles (mean) | expert plan (steps) | generation / game | "
        "reset G=8 cold | reset G=8 warm | step median (p90), no replan | "
        "step median (p90), replan | RSS / env |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['n']} | {r['receptacles']:.1f} | {r['walkthrough_len']:.1f} | "
            f"{r['gen_s_per_game']:.2f} s | {r['group8_reset_cold_s']:.3f} s | "
            f"{r['group8_reset_warm_s']:.3f} s | "
            f"{r['step_median_ms_noplan']:.1f} ms ({r['step_p90_ms_noplan']:.1f}) | "
            f"{r['step_median_ms_plan']:.1f} ms ({r['step_p90_ms_plan']:.1f}) | "
            f"{r['rss_mb_per_env']:.1f} MiB |"
        )
    st = rows[0]["stock"]
    lines += [
        "",
        f"Stock engine (textworld `PddlEnv` + ALFWorld wrappers, no sharing or caching) on "
        f"the same small games: load+reset {st[0]:.2f} s per environment, median step "
        f"{st[1]:.1f} ms with replan.",
    ]
    lines += [
        "",
        "Targets (issue 4): reset of a group of 8 <= 1 s, median step <= 20 ms on default games.",
        "Generation includes the planner check (the plan is played to `won`) and the rejection",
        "of candidates that belong to another set. Cold reset = the process parses the game for",
        "the first time (the goal grammar is shared across games); warm = the parsed game is",
        "cached and the environments are reused, as the rollout engine does. The machine is",
        "shared and noisy: compare the ratios within one run.",
        "",
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
