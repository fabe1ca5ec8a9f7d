"""The paper's defaults and the helpers every stage config uses: ``doc`` (a field with its help
text), ``help_for`` (that text, for the CLI), the option checks and parsers."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any

from srollout.core.audit import DEFAULT_FLOOR
from srollout.core.gate import check_step
from srollout.errors import SrolloutError

# The paper's operating point and rollout settings (Table "Hyperparameters").
PAPER_K = 10
PAPER_D_L = 0.12
PAPER_G = 8
PAPER_T_MAX = 30
PAPER_TEMPERATURE = 0.7
PAPER_PRECISION_FLOOR = 0.80
PAPER_K_VALUES = (5, 10, 15, 20)


def doc(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with its help text attached (a tuple, not a list, for a sequence)."""
    return field(default=default, metadata={"help": help}, **kw)


# The audited gate's options (srollout.core.audit), declared once for train-onpolicy, collect
# and ab-rollout; the floor's default is core.audit's own.
AUDIT_PRECISION_FLOOR = DEFAULT_FLOOR


def audit_field(between: str, stops: bool = False) -> Any:
    """``--audit F``: the share of the gate's cuts rolled on to T_max; ``between``: the stage's
    unit the threshold moves between ("iterations", ...); ``stops``: the stage audits the
    trajectory gate's stops too."""
    also = (
        "; the same share of the trajectory gate's stops (--stall, the stall arms) plays on, "
        "and W moves"
        if stops
        else ""
    )
    return doc(
        0.0,
        "Audited gate: roll this seeded share of the cut groups on to T_max (counted in the "
        f"run's time) and move the gate's d_L (or a learned gate's threshold) between {between} "
        "so that the Clopper-Pearson bound on its precision stays at or above --audit-floor"
        f"{also} (0 = off; docs/gates.md).",
    )


def audit_floor_field() -> Any:
    """``--audit-floor P`` (``--precision-floor``, its old name): the precision the audited
    gate's cuts must keep."""
    return doc(
        AUDIT_PRECISION_FLOOR,
        "Audited gate: the precision its cuts (and stops) must keep, as a 95 % lower bound, in "
        "(0, 1). Its old name --precision-floor still works.",
    )


def stall_field() -> Any:
    """``--stall W``: the trajectory gate's W (0 = off)."""
    return doc(
        0,
        "Trajectory gate: end a trajectory once none of its last W observations (W = --stall) "
        "was new to it, from step --stall-from; it keeps the reward it earned so far and its "
        "slot goes to the next group (0 = off; `sweep --stall` chooses W; docs/gates.md). In "
        "ab-rollout and train-onpolicy it is the rule of the stall arms (stall, gated+stall, "
        "stall+dapo, stall+greso; W 8 from step 10 when not given). --gate also takes a "
        "gate-stall.json.",
    )


def stall_from_field() -> Any:
    """``--stall-from K0``: the first step the trajectory gate may fire at."""
    return doc(10, "First step k0 at which --stall may end a trajectory, in [1, T_max].")


def check_stall(stall: Any, stall_from: Any, T_max: int) -> None:
    """--stall / --stall-from: integers, W >= 0 (0 = off), k0 in [1, T_max] while it is on."""
    for name, value in (("--stall", stall), ("--stall-from", stall_from)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise SrolloutError(f"{name} must be an integer, got {value!r}")
    if stall < 0:
        raise SrolloutError(f"--stall W must be >= 1 (0 turns it off), got {stall}")
    if stall_from < 1:
        raise SrolloutError(f"--stall-from must be >= 1, got {stall_from}")
    # the default k0 (10) may exceed a short --T-max while the trajectory gate is off
    if stall:
        check_step(stall_from, T_max, "stall_from")


def check_run_dir_options(config: Any) -> None:
    """--out / --overwrite / --resume of a stage that writes a run directory."""
    if config.overwrite and config.resume:
        raise SrolloutError("--overwrite and --resume exclude each other")
    if config.resume and config.out is None:
        raise SrolloutError("--resume needs --out RUN_DIR (the run to continue)")


class Resumable:
    """A stage config that continues a run with --resume: ``resume_key`` holds the fields that
    must match the run's (all but ``RESUME_SKIP``: where and how to write, and such)."""

    RESUME_SKIP: frozenset[str] = frozenset()

    def resume_key(self) -> dict[str, Any]:
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        return {f.name: getattr(self, f.name) for f in fields if f.name not in self.RESUME_SKIP}


def check_stall_arms(stall: int, arms: Any) -> None:
    """--stall sets the trajectory gate of the stall arms: refused when none of ``arms`` (ArmSpecs)
    is one (a stall gate.json in --gate: :func:`srollout.stages.rollout_setup.plan_gates`)."""
    if stall and not any(a.stall for a in arms):
        raise SrolloutError(
            f"--stall sets the trajectory gate of the stall arms; none of --arms "
            f"{','.join(a.name for a in arms)} is one: add stall, gated+stall, stall+dapo or "
            "stall+greso (e.g. --arms baseline,stall)"
        )


def loop_field() -> Any:
    """``--loop K0``: the loop detector from step K0 (0 = off)."""
    return doc(
        0,
        "Loop detector (gate kind loop, the field's fixed rule after OpenHands' StuckDetector): "
        "from step K0, end a trajectory whose last 4 (action, observation) pairs are identical, "
        "or whose last 3 actions are identical and were all rejected, or whose last 6 pairs "
        "alternate A, B, A, B, A, B (0 = off; docs/gates.md). In ab-rollout it is the rule of the "
        "loop arm (from step 1 when not given). --gate also takes a loop gate file "
        '({"kind": "loop", "k0": K0}).',
    )


def check_loop(loop: Any, T_max: int) -> None:
    """--loop: an integer, K0 >= 0 (0 = off), K0 <= T_max while it is on."""
    if isinstance(loop, bool) or not isinstance(loop, int) or loop < 0:
        raise SrolloutError(f"--loop K0 must be an integer >= 1 (0 turns it off), got {loop!r}")
    if loop:
        check_step(loop, T_max, "loop")


def check_loop_arms(loop: int, stall: int, stall_from: int, arms: Any, audit: float = 0) -> None:
    """--loop sets the loop arm's rule, --stall / --stall-from the stall arms': refused when no
    arm of ``arms`` (ArmSpecs) takes them; --audit moves thresholds, which the loop arm has none
    of."""
    names = ",".join(a.name for a in arms)
    if audit > 0 and any(a.loop for a in arms):
        raise SrolloutError(
            "--audit moves a gate's threshold; the loop arm's loop detector has none: run the "
            "loop arm in an A/B without --audit"
        )
    if loop and not any(a.loop for a in arms):
        raise SrolloutError(
            f"--loop sets the loop detector of the loop arm; --arms {names} has none: add loop "
            "(e.g. --arms baseline,loop)"
        )
    stall_given = stall or stall_from != stall_from_field().default
    if stall_given and any(a.loop for a in arms) and not any(a.stall for a in arms):
        option = "--stall" if stall else "--stall-from"
        raise SrolloutError(
            f"{option} is a stall arm's option and --arms {names} has none: the loop arm takes "
            "--loop K0 (its first step), or add a stall arm (e.g. --arms baseline,stall,loop)"
        )


def help_for(config_cls: type, name: str) -> str:
    """The help text of ``config_cls.name`` (used by the CLI option of the same name)."""
    return config_cls.__dataclass_fields__[name].metadata.get("help", "")


def _check_K(values: tuple[int, ...], option: str) -> None:
    if not values:
        raise SrolloutError(f"{option}: give at least one K")
    bad = [k for k in values if k < 1]
    if bad:
        raise SrolloutError(f"{option}: K must be >= 1, got {bad[0]}")


def _check_unit(values: tuple[float, ...], option: str) -> None:
    if not values:
        raise SrolloutError(f"{option}: the grid is empty")
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    if bad:
        raise SrolloutError(f"{option}: values must lie in [0, 1], got {bad[0]:g}")


def check_at_least(config: Any, **lows: int) -> None:
    """Each named field of ``config`` (None: not given) >= its bound, else one SrolloutError
    naming its flag."""
    for name, low in lows.items():
        value = getattr(config, name)
        if value is not None and value < low:
            raise SrolloutError(f"--{name.replace('_', '-')} must be >= {low}, got {value}")


def _check_seed(seed: int) -> None:
    """``--seed`` >= 0 (numpy's generators take no negative seed), else one line."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SrolloutError(f"--seed must be an integer >= 0, got {seed}")


def _check_choice(value: str, choices: Any, option: str) -> None:
    if value not in choices:
        raise SrolloutError(f"{option}: expected one of {', '.join(choices)}, got {value!r}")


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """``"5,10,15"`` -> ``(5, 10, 15)``; one clear SrolloutError on anything else."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise SrolloutError(
            f"{option}: expected integers separated by commas, got {text!r}"
        ) from None
    if len(set(values)) != len(values):
        raise SrolloutError(f"{option}: repeated value in {text!r}")
    return values


def parse_grid(text: str, option: str) -> tuple[float, ...]:
    """A float grid: ``"start:stop:step"`` (stop included within float tolerance) or ``"a,b,c"``.

    ``"0.05:0.18:0.01"`` -> (0.05, 0.06, ..., 0.18), 14 values, each rounded to 10 decimals so
    that 0.05 + 7*0.01 prints (and compares) as 0.12. Raises SrolloutError naming ``option``.
    """
    text = str(text).strip()
    malformed = (
        f"{option}: malformed grid {text!r}; use start:stop:step (e.g. 0.05:0.18:0.01) "
        "or a comma list"
    )
    try:
        if ":" in text:
            parts = text.split(":")
            if len(parts) != 3:
                raise SrolloutError(malformed)
            start, stop, step = (float(p) for p in parts)
            if not step > 0 or stop < start or not all(map(math.isfinite, (start, stop, step))):
                raise SrolloutError(malformed)
            n = int((stop - start) / step + 1e-9) + 1
            if n > 100_000:
                raise SrolloutError(f"{option}: grid {text!r} has {n} points; use a coarser step")
            values = [round(start + i * step, 10) for i in range(n)]
        else:
            values = [float(p) for p in text.split(",")]
            if not all(map(math.isfinite, values)):
                raise SrolloutError(malformed)
    except ValueError:
        raise SrolloutError(malformed) from None
    if len(set(values)) != len(values):
        raise SrolloutError(f"{option}: repeated value in {text!r}")
    return tuple(values)


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"7,13,23,42"`` -> (7, 13, 23, 42): distinct integers >= 0, else one SrolloutError."""
    seeds = parse_int_list(text, "--seeds")
    if any(s < 0 for s in seeds):
        raise SrolloutError(f"--seeds: seeds must be >= 0, got {text!r}")
    return seeds


def parse_names(text: str, option: str) -> tuple[str, ...]:
    """``"q_proj, v_proj"`` -> ("q_proj", "v_proj"); empty items are an error."""
    names = tuple(p.strip() for p in str(text).split(","))
    if not names or any(not n for n in names):
        raise SrolloutError(f"{option}: expected names separated by commas, got {text!r}")
    return names
