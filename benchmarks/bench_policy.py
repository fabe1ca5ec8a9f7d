"""Benchmark the transformers backend: generated tokens/s at batch 1 vs 64, KV reuse vs
re-encoding on a 20-turn conversation, and how often batch composition flips a token.

    python benchmarks/bench_policy.py [--model DIR] [--threads 2] [--out docs/bench/policy.md]

Measured side by side in one run (these machines are noisy); results go to a markdown file with
the date and machine. The default model is the one srollout builds (built first if missing).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import time
from pathlib import Path

OBSERVATIONS = [
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a "
    "countertop 1, a drawer 1, a fridge 1, a microwave 1, and a sinkbasin 1.\n\nYour task is "
    "to: put a cool apple in countertop.",
    "You arrive at cabinet 1. The cabinet 1 is closed.",
    "You open the cabinet 1. The cabinet 1 is open. In it, you see a bowl 1.",
    "Nothing happens.",
    "You arrive at countertop 1. On the countertop 1, you see a apple 1, and a knife 2.",
    "You pick up the apple 1 from the countertop 1.",
    "You arrive at fridge 1. The fridge 1 is closed.",
    "You cool the apple 1 using the fridge 1.",
]


def _requests(keys, step, system, seed0=1000):
    from srollout.envs.prompts import user_turn
    from srollout.policy.base import ActRequest

    return [
        ActRequest(
            key=k,
            step=step,
            seed=seed0 + k.traj_idx,
            system=system,
            user=user_turn(OBSERVATIONS[(step - 1 + k.traj_idx) % len(OBSERVATIONS)]),
        )
        for k in keys
    ]


def run_conversation(policy, n_rows: int, n_turns: int, system: str, group: str = "b"):
    """n_rows trajectories for n_turns turns, all rows in every act(); returns
    (seconds, generated tokens, prompt tokens fed, texts per row, token ids per row)."""
    from srollout.policy.base import TrajKey

    keys = [TrajKey(group, i) for i in range(n_rows)]
    texts = {k: [] for k in keys}
    gen = fed = 0
    t0 = time.perf_counter()
    for step in range(1, n_turns + 1):
        reqs = _requests(keys, step, system)
        for r, a in zip(reqs, policy.act(reqs), strict=False):
            texts[r.key].append(a.text)
            gen += a.n_gen_tokens
            fed += a.n_prompt_tokens
    seconds = time.perf_counter() - t0
    toks = {k: policy.finish(k).token_ids for k in keys}
    return seconds, gen, fed, texts, toks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", default=None, help="HF model dir (default: the built default policy)"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--turns", type=int, default=20, help="turns of the KV-vs-re-encode conversation"
    )
    ap.add_argument(
        "--flip-turns", type=int, default=10, help="turns of the batch-composition test"
    )
    ap.add_argument("--out", default="docs/bench/policy.md")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from srollout.default_policy import default_policy
    from srollout.envs.prompts import system_prompt_for
    from srollout.policy.transformers_backend import TransformersPolicy

    model = Path(args.model) if args.model else default_policy()
    system = system_prompt_for(model)
    rows: list[tuple[str, str]] = []

    def pol(**kw):
        kw.setdefault("temperature", 0.7)
        kw.setdefault("max_new_tokens", 48)
        return TransformersPolicy(model, **kw)

    # 1. throughput: batch 1 vs batch 64, 5 turns each (prefill of the new turn included)
    thr = {}
    for b in (1, 8, 64):
        s, g, f, _, _ = run_conversation(pol(), b, 5, system)
        thr[b] = g / s
        rows.append(
            (
                f"generated tokens/s, batch {b} (5 turns, KV reuse)",
                f"{g / s:,.0f} tok/s ({g} tokens in {s:.1f} s)",
            )
        )
    rows.append(("batch 64 / batch 1 throughput", f"{thr[64] / thr[1]:.1f}x"))

    # 2. KV reuse vs re-encode on a long conversation (greedy, so outputs must agree)
    res = {}
    for kv in (True, False):
        res[kv] = run_conversation(pol(temperature=0.0, kv_reuse=kv), 8, args.turns, system)
    same = sum(res[True][4][k] == res[False][4][k] for k in res[True][4])
    for kv, label in ((True, "KV reuse"), (False, "re-encode")):
        s, g, f, _, _ = res[kv]
        rows.append(
            (
                f"{args.turns}-turn conversation x 8 rows, {label}",
                f"{s:.1f} s, {g / s:,.0f} gen tok/s, {f:,} tokens fed",
            )
        )
    rows.append(("re-encode / KV reuse wall-clock", f"{res[False][0] / res[True][0]:.2f}x"))
    rows.append(("greedy token sequences identical (KV vs re-encode)", f"{same}/8"))

    # 3. batch-composition sensitivity: 8 trajectories alone vs inside a batch of 64, T=0.7
    alone = run_conversation(pol(), 8, args.flip_turns, system)[4]
    inside = run_conversation(pol(), 64, args.flip_turns, system)[4]
    ident = sum(alone[k] == inside[k] for k in alone)
    flips = []
    for k in alone:
        a, b = alone[k], inside[k]
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        flips.append(first)
    n_tok = sum(len(v) for v in alone.values())
    rows.append(
        (
            f"8 trajectories alone vs in a batch of 64 ({args.flip_turns} turns, T=0.7): identical",
            f"{ident}/8 ({n_tok:,} tokens)",
        )
    )
    if any(f is not None for f in flips):
        rows.append(
            (
                "first differing position of the others",
                ", ".join(str(f) for f in flips if f is not None),
            )
        )

    cfg = (
        torch.__config__.parallel_info().splitlines()[0]
        if hasattr(torch.__config__, "parallel_info")
        else ""
    )
    lines = [
        "# Transformers backend benchmark",
        "",
        f"- date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
        f"{torch.__version__}, {args.threads} threads {cfg}",
        f"- model: `{model}`",
        "- command: `python benchmarks/bench_policy.py`",
        "- note: the CPU was shared with other jobs; ratios measured side by side are what to read",
        "",
        "| measure | value |",
        "|---|---|",
        *[f"| {a} | {b} |" for a, b in rows],
        "",
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
