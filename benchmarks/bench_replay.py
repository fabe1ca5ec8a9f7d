"""Benchmark the rollout engine against its backend alone: a real ``collect`` records every call
it makes to the policy, tick by tick; the same calls are then replayed on the same policy with
no environment, no signals, no gate check and no part files. Appends to docs/bench/replay.md.

What is compared, both on the same warmed policy object, one after the other:

- ``collect``: :func:`srollout.stages.collect.run_collect` as ``srollout collect`` runs it (the
  engine, ALFWorld steps and resets, signals, one part file per finished group, the merge), with
  the policy wrapped in a recorder that keeps each ``act`` batch (the requests, in order) and each
  ``finish``. Its throughput is generated tokens over the rollout's wall-clock (the summary's
  "throughput" row, what the progress bar shows).
- ``replay``: the recorded calls fed to the policy again in the same order: the same batches, the
  same prompts, the same seeds, so the same generated tokens (checked: the replay's texts and
  token counts are compared with the collect's). Its throughput is the backend's ceiling for
  this work: nothing but ``act`` and ``finish`` runs. vLLM's prefix cache is emptied first, so
  the replay does not find the collect's prompts already computed.

``collect ÷ replay`` is the share of the backend's throughput the engine keeps (goal ≥ 80 %,
issue 37). The collect's own split (generation, env steps, resets, other) says where the rest
goes; ``gen ÷ replay`` says whether generation itself ran slower inside the engine.

Usage::

    python benchmarks/bench_replay.py --backend transformers --groups 40
    python benchmarks/bench_replay.py --backend vllm --groups 40      # make setup-vllm
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Recorder:
    """A policy that passes every call to ``inner`` and keeps them: ("act", requests, texts,
    tokens) per batch and ("finish", key) per ended trajectory, in call order."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls: list[tuple] = []

    def act(self, requests: list) -> list:
        responses = self.inner.act(requests)
        texts = [r.text for r in responses]
        self.calls.append(("act", list(requests), texts, [r.n_gen_tokens for r in responses]))
        return responses

    def finish(self, key: Any) -> Any:
        self.calls.append(("finish", key))
        return self.inner.finish(key)


def replay(policy: Any, calls: list[tuple]) -> dict[str, float]:
    """Feed ``calls`` to ``policy``; return the wall-clock, the time in act, the tokens and the
    share of responses whose text equals the recorded one."""
    act_s, tokens, same, rows = 0.0, 0, 0, 0
    t0 = time.perf_counter()
    for call in calls:
        if call[0] == "finish":
            policy.finish(call[1])
            continue
        a0 = time.perf_counter()
        responses = policy.act(call[1])
        act_s += time.perf_counter() - a0
        tokens += sum(r.n_gen_tokens for r in responses)
        same += sum(r.text == t for r, t in zip(responses, call[2], strict=True))
        rows += len(responses)
    return {"wall_s": time.perf_counter() - t0, "act_s": act_s, "tokens": tokens,
            "same_text": same / max(rows, 1), "rows": rows}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="transformers", choices=("transformers", "vllm"))
    parser.add_argument("--model", default="default")
    parser.add_argument("--groups", type=int, default=40)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--T-max", dest="T_max", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument(
        "--device", default="cpu", help="transformers backend only: cpu, or cuda on a GPU"
    )
    parser.add_argument("--dtype", default=None, help="transformers backend only: bfloat16, ...")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "replay.md")
    args = parser.parse_args()

    import torch

    import srollout.stages.collect as stage
    from srollout.config import CollectConfig
    from srollout.policy import resolve_model
    from srollout.rollout.engine import RolloutSettings
    from srollout.rollout.warmup import warm_up
    from srollout.stages.rollout_setup import build_policy, plan_rollout

    torch.set_num_threads(args.threads)
    args.model = resolve_model(args.model)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        config = CollectConfig(
            out=Path(tmp) / "run", policy="lm", model=args.model, backend=args.backend,
            groups=args.groups, G=args.G, T_max=args.T_max, concurrency=args.concurrency,
            seed=args.seed,
        )  # fmt: skip
        plan = plan_rollout(config)  # the stage below is handed the same plan
        if args.backend == "transformers" and (args.device != "cpu" or args.dtype):
            from srollout.policy import make_policy  # build_policy's, on another device or dtype

            policy = make_policy(
                model_dir=plan.model_dir, adapter=config.adapter, temperature=config.temperature,
                top_p=config.top_p, device=args.device, dtype=args.dtype,
            )  # fmt: skip
        else:
            policy = build_policy(config, plan.model_dir)
        settings = RolloutSettings(
            G=config.G, T_max=config.T_max, seed=config.seed, concurrency=config.concurrency
        )
        w0 = time.perf_counter()
        warm_up(
            plan.env_factory(),
            plan.tasks,
            policy=policy,
            prompter=plan.prompter(),
            settings=settings,
        )
        warm_s = time.perf_counter() - w0
        recorder = Recorder(policy)
        original = stage.build_policy
        stage.build_policy = lambda _config, _model_dir: recorder
        try:
            t0 = time.perf_counter()
            result = stage.run_collect(config, progress=False, plan=plan)
            collect_process_s = time.perf_counter() - t0
        finally:
            stage.build_policy = original
        s = result.summary
        rec_tokens = sum(sum(c[3]) for c in recorder.calls if c[0] == "act")
        # vLLM keeps every prompt it saw in its prefix cache: the replay would find the collect's
        # turns already computed. Emptied, so both runs compute the same prefills (the
        # conversation's earlier turns hit the cache in both, as in any collect).
        llm = getattr(policy, "llm", None)
        if llm is not None:
            llm.reset_prefix_cache()
        r = replay(policy, recorder.calls)
    load_after = os.getloadavg()

    ticks = sum(1 for c in recorder.calls if c[0] == "act")
    collect_tps = s.n_gen_tokens / s.wall_s
    gen_tps = s.n_gen_tokens / s.gen_s
    replay_tps = r["tokens"] / r["wall_s"]
    other = s.wall_s - s.gen_s - s.env_s - s.reset_s
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    device += f" ({getattr(policy, 'dtype', 'the engine default')})"
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
         if ln.startswith("model name")), platform.processor(),
    )  # fmt: skip
    text = (
        f"## {stamp} — backend `{args.backend}` on {device}, {cpu}, {os.cpu_count()} cores, torch "
        f"{torch.__version__} on {args.threads} thread(s), load {load[0]:.1f} before / "
        f"{load_after[0]:.1f} after\n\n"
        f"Command: `python benchmarks/bench_replay.py {' '.join(sys.argv[1:])}` — model "
        f"`{args.model}`, {args.groups} groups, G={args.G}, T_max={args.T_max}, concurrency "
        f"{args.concurrency}; warm-up {warm_s:.1f} s before, untimed.\n\n"
        "| | wall-clock | generated tokens | tok/s | share of replay |\n|---|---|---|---|---|\n"
        f"| collect (rollout) | {s.wall_s:.1f} s | {s.n_gen_tokens:,} | {collect_tps:,.0f} | "
        f"**{collect_tps / replay_tps:.0%}** |\n"
        f"| collect, inside generate only | {s.gen_s:.1f} s | {s.n_gen_tokens:,} | "
        f"{gen_tps:,.0f} | {gen_tps / replay_tps:.0%} |\n"
        f"| replay (act + finish alone) | {r['wall_s']:.1f} s | {r['tokens']:,} | "
        f"{replay_tps:,.0f} | 100% |\n\n"
        f"- The collect's rollout wall-clock: generation {s.gen_s:.1f} s "
        f"({s.gen_s / s.wall_s:.0%}), env steps {s.env_s:.1f} s ({s.env_s / s.wall_s:.0%}), "
        f"resets {s.reset_s:.1f} s ({s.reset_s / s.wall_s:.0%}), other (signals, gate, "
        f"bookkeeping, part files) {other:.1f} s ({other / s.wall_s:.0%}); the whole process "
        f"(merge and report included) {collect_process_s:.1f} s.\n"
        f"- {ticks} batched calls, mean batch {s.rows / max(ticks, 1):.1f} rows; the replay's "
        f"time inside act {r['act_s']:.1f} s; recorded tokens {rec_tokens:,}, replayed "
        f"{r['tokens']:,}; replayed texts equal to the collect's: {r['same_text']:.1%}.\n"
    )
    print(text)
    if not args.out.exists():
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            "# The engine against its backend: replay benchmarks\n\nAppended by "
            "`benchmarks/bench_replay.py`; newest last.\n\n"
        )
    with args.out.open("a") as fh:
        fh.write(text + "\n")


if __name__ == "__main__":
    main()
