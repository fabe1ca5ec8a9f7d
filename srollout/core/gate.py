"""Gate rules: decide at step K whether to cut a group (paper Eq. "gate", App. "OR-rule").

- R1 (default, the paper's production gate): cut iff d_K < d_L.
- R3 (OR-rule extension): cut iff d_K < d_L or τ_K >= t_high.

A cut group stops rolling out at step K and is dropped from the GRPO batch. Every gate kind
implements one contract, :class:`Gate`, and is saved as ``gate.json`` (``{"kind": ...,
"version": ..., ...}``); :func:`load_gate` dispatches on "kind" through a registry: a kind
registers with the :func:`gate_kind` decorator, and a kind of another package through an entry
point of group ``srollout.gates`` (docs/extending.md).

Usage inside your own trainer::

    from srollout.core.gate import should_cut
    if should_cut(actions_by_traj, K=10, d_L=0.12):  # after step K of a group
        ...  # stop the group's trajectories, drop the group from the GRPO batch
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np

from srollout.atomic import atomic_write_json
from srollout.core.signals import (
    GroupSignals,
    compute_signals,
    prefix_edit_distance,
    termination_fraction,
)
from srollout.errors import ArgumentError, SrolloutError, entry_point
from srollout.signal_names import SIGNAL_NAMES

RULES = ("r1", "r3")
GATE_FILE_VERSION = 1


class AuditKnob(NamedTuple):
    """The one threshold of a gate kind an audit may move, as "cut iff score < theta" (the form
    of :mod:`srollout.core.audit`): ``score(signals)``, ``theta`` at the start, ``gate_at(theta)``
    the gate at another theta, ``shown(theta)`` theta in the gate's own units."""

    score: Callable[[GroupSignals], float]
    theta: float
    gate_at: Callable[[float], Gate]
    shown: Callable[[float], float]


class Gate:
    """The gate contract: what every gate kind implements, and all that the engine, sweep,
    audit, A/B, on-policy training, TRL and verl use of a gate. Its members and their defaults:
    docs/extending.md ("A gate kind"); ``kind`` is set by :func:`gate_kind`."""

    kind: ClassVar[str] = ""
    scope: ClassVar[str] = "group"
    required_keys: ClassVar[tuple[str, ...] | None] = None  # from_dict's; None: no default
    K: int

    def check_steps(self, T_max: int | None = None) -> tuple[int, ...]:
        """The steps (ascending) at which a group must be shown to the gate, those > T_max left
        out."""
        return tuple(k for k in (int(self.K),) if T_max is None or k <= T_max)

    def decide(self, signals: GroupSignals) -> bool:
        """True iff the group is cut, given its signals at step K (a group kind defines it; any
        other refuses in one line)."""
        raise SrolloutError(f"a {self.kind or type(self).__name__!r} gate decides no group")

    def decide_at(self, K: int, signals: GroupSignals) -> bool:
        """True iff the group is cut at check step K."""
        return K == self.K and bool(self.decide(signals))

    def decide_batch(self, K: int, signals: Mapping[str, Any]) -> np.ndarray:
        """:meth:`decide_at` for N groups: ``signals`` maps each signal's name
        (``srollout.signal_names``) to N values; bool[N]."""
        names = SIGNAL_NAMES
        columns = {n: np.asarray(signals[n], dtype=np.float64) for n in names}
        steps = {n: np.asarray(v, dtype=np.float64) for n, v in signals.items() if n not in names}
        n = len(next(iter(columns.values())))
        rows = (
            GroupSignals(
                **{k: float(v[i]) for k, v in columns.items()},
                steps=tuple((k, float(v[i])) for k, v in steps.items()),  # the step signals
            )
            for i in range(n)
        )
        return np.fromiter((self.decide_at(K, row) for row in rows), dtype=bool, count=n)

    def should_cut(
        self, actions: Sequence[Sequence[str]], observations: Sequence[Sequence[str]] | None = None
    ) -> bool:
        """:meth:`decide` from the raw group: G action lists (see ``compute_signals``), only the
        first K used."""
        return self.decide(compute_signals(actions, self.K, observations))

    def check(self, T_max: int) -> None:
        """Refuse a gate that can never act within T_max steps (one SrolloutError)."""
        if self.scope == "group" and not self.check_steps(T_max):
            check_step(self.K, T_max, of="gate K")

    def stops(self, state: Any) -> bool:
        """A trajectory gate's decision after a step of one trajectory: end it now? (A trajectory
        kind defines it; any other refuses in one line.)"""
        raise SrolloutError(f"a {self.kind or type(self).__name__!r} gate stops no trajectory")

    def audit_knob(self) -> AuditKnob | None:
        """The threshold an audit may move; None when this kind has none."""
        return None

    def to_dict(self) -> dict[str, Any]:
        """The gate.json content: its kind, the file version and, by default, every field of
        the kind's dataclass."""
        return {"kind": self.kind, "version": GATE_FILE_VERSION, **_fields_of(type(self), self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "gate") -> Gate:
        """Inverse of :meth:`to_dict`; SrolloutError naming ``source`` on a bad dict. By default
        the kind's dataclass from its fields: ``required_keys`` (default: those without a default)
        required, no other."""
        fields = _fields_of(cls)
        required = cls.required_keys or [
            n for n, f in fields.items() if f.default is MISSING and f.default_factory is MISSING
        ]
        optional = [n for n in fields if n not in required]
        body = _check_header(d, cls.kind, source)
        _check_keys(body, required=required, optional=optional, source=source)
        try:
            return cls(**body)
        except SrolloutError as err:
            raise SrolloutError(f"{source}: {err}") from None

    def save(self, path: str | Path) -> Path:
        """Write gate.json atomically; returns the path."""
        return atomic_write_json(self.to_dict(), Path(path))

    @classmethod
    def load(cls, path: str | Path) -> Any:
        """Read a gate.json that must hold this kind."""
        gate = load_gate(path)
        if not isinstance(gate, cls):
            got, article = gate.to_dict()["kind"], "an" if cls.kind[:1] in tuple("aeiou") else "a"
            raise SrolloutError(f"{path}: holds a {got!r} gate, expected {article} {cls.kind} gate")
        return gate


# kind -> from_dict(d, source): filled by @gate_kind.
_GATE_KINDS: dict[str, Callable[[Mapping[str, Any], str], Gate]] = {}

# The kinds of srollout defined in modules of their own (they import this one): imported on
# first use, so that load_gate reads every kind without this module importing them.
_LAZY_GATE_KINDS = {
    "learned": "srollout.core.learned_gate",
    "adaptive": "srollout.core.adaptive_gate",
    "audited": "srollout.core.audited_gate",
    "stall": "srollout.core.trajectory_gate",
    "loop": "srollout.core.trajectory_gate",
}
ENTRY_POINT_GROUP = "srollout.gates"  # kinds of other packages: name = kind, value = the class

GK = TypeVar("GK", bound=type)


def gate_kind(kind: str) -> Callable[[GK], GK]:
    """Class decorator: register a :class:`Gate` subclass as the gate.json kind ``kind``."""

    def register(cls: GK) -> GK:
        if not (isinstance(cls, type) and issubclass(cls, Gate)):
            raise SrolloutError(f"gate kind {kind!r}: {cls!r} is not a subclass of srollout's Gate")
        cls.kind = kind
        _GATE_KINDS[kind] = cls.from_dict
        return cls

    return register


def register_gate_kind(kind: str, from_dict: Callable[[Mapping[str, Any], str], Gate]) -> None:
    """Make :func:`load_gate` understand ``{"kind": kind, ...}`` files (the function form of
    :func:`gate_kind`)."""
    _GATE_KINDS[kind] = from_dict


def _entry_point_kind(kind: str, source: str) -> None:
    """Load the entry point of group ``srollout.gates`` named ``kind``, if one is installed: its
    module registers the kind (or the entry point is the class, registered here)."""
    found = entry_point(ENTRY_POINT_GROUP, kind, f"{source}: gate kind {kind!r}")
    if found is not None and kind not in _GATE_KINDS:
        gate_kind(kind)(found[0])


def _as_unit_float(value: Any, name: str) -> float:
    """``value`` as a float in [0, 1], or SrolloutError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SrolloutError(f"{name} must be a number in [0, 1], got {value!r}")
    x = float(value)
    if not 0.0 <= x <= 1.0:  # also rejects nan
        raise SrolloutError(f"{name} must be in [0, 1], got {value}")
    return x


def _as_step(value: Any, name: str = "K") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise SrolloutError(f"{name} must be an integer step >= 1, got {value!r}")
    return int(value)


def _elementwise(values: Any) -> Any:
    """One number as it is (a Python or numpy float), anything else as a float64 array."""
    if isinstance(values, (float, int)) and not isinstance(values, bool):
        return values
    return np.asarray(values, dtype=np.float64)


def _is_missing(value: Any) -> bool:
    """None, or nan (a null t_high read back from a sweep table)."""
    return value is None or (isinstance(value, (float, np.floating)) and math.isnan(value))


@gate_kind("threshold")
@dataclass(frozen=True)
class GateRule(Gate):
    """A threshold gate evaluated at step K.

    rule: "r1" (cut iff d_K < d_L) or "r3" (cut iff d_K < d_L or τ_K >= t_high).
    K: the evaluation step (paper: 10). d_L: the edit-distance threshold in [0, 1] (paper: 0.12);
    d_L = 0 never fires on d_K (d_K >= 0). t_high: the τ_K threshold in [0, 1], r3 only.
    """

    rule: str = "r1"
    K: int = 10
    d_L: float = 0.12
    t_high: float | None = None
    required_keys: ClassVar[tuple[str, ...]] = ("rule", "K", "d_L")  # in a gate.json

    def __post_init__(self) -> None:
        rule = self.rule.lower() if isinstance(self.rule, str) else self.rule
        if rule not in RULES:
            raise SrolloutError(f"gate rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        object.__setattr__(self, "rule", rule)
        object.__setattr__(self, "K", _as_step(self.K))
        object.__setattr__(self, "d_L", _as_unit_float(self.d_L, "d_L"))
        if rule == "r3":
            if _is_missing(self.t_high):
                raise SrolloutError(
                    "rule r3 needs t_high in [0, 1] (cut iff d_K < d_L or tau_K >= t_high)"
                )
            object.__setattr__(self, "t_high", _as_unit_float(self.t_high, "t_high"))
        elif _is_missing(self.t_high):
            object.__setattr__(self, "t_high", None)
        else:
            # R3 silently on when R1 was meant is a known mistake of the reference code; the
            # reverse (a t_high that is silently ignored) is refused just as loudly.
            raise SrolloutError(
                f"t_high={self.t_high} is only used by rule r3; pass rule='r3' or drop t_high"
            )

    def decide(self, signals: GroupSignals) -> bool:
        """True iff the group is cut, given its signals at step K (nan d_K: no cut):
        :meth:`decide_arrays` on the group's two floats."""
        tau_K = signals.termination_fraction if self.rule == "r3" else None
        return bool(self.decide_arrays(signals.prefix_edit_distance_mean, tau_K))

    def decide_arrays(self, d_K: Any, tau_K: Any = None) -> Any:
        """The rule, its one body: cut iff d_K < d_L (R3: or τ_K >= t_high), elementwise over the
        two signals it reads (τ_K needed by r3 only). [N] values in, bool[N] out; one group's
        floats in, one bool out, with no array made (the scalar forms call it so). nan d_K
        never cuts."""
        cut = _elementwise(d_K) < self.d_L
        if self.rule == "r3":
            if tau_K is None:
                raise SrolloutError("rule r3 needs tau_K (termination_fraction)")
            cut = cut | (_elementwise(tau_K) >= self.t_high)
        return cut

    def decide_batch(self, K: int, signals: Mapping[str, Any]) -> np.ndarray:
        """:meth:`decide_arrays` on the signals by name (only at the gate's own K)."""
        tau = signals.get("termination_fraction") if self.rule == "r3" else None
        cut = self.decide_arrays(signals["prefix_edit_distance_mean"], tau)
        return cut if K == self.K else np.zeros_like(cut)

    def audit_knob(self) -> AuditKnob:
        """The audit moves d_L (cut iff d_K < d_L)."""
        return AuditKnob(
            lambda s: float(s.prefix_edit_distance_mean),
            self.d_L,
            lambda t: dataclasses.replace(self, d_L=t),
            lambda t: t,
        )

    def should_cut(
        self, actions: Sequence[Sequence[str]], observations: Sequence[Sequence[str]] | None = None
    ) -> bool:
        """Decide from the raw group (G action lists, only the first K used), computing only what
        the rule reads (d_K, and τ_K for r3); ``observations`` are validated when given."""
        if observations is not None:
            return self.decide(compute_signals(actions, self.K, observations))
        tau_K = termination_fraction(actions, self.K) if self.rule == "r3" else None
        return bool(self.decide_arrays(prefix_edit_distance(actions, self.K), tau_K))

    @classmethod
    def never(cls, K: int = 10) -> GateRule:
        """An R1 gate that never fires (d_L = 0 and d_K >= 0): gated training equals plain GRPO."""
        return cls(rule="r1", K=K, d_L=0.0)


@gate_kind("fixed")
@dataclass(frozen=True)
class FixedGate(Gate):
    """A gate whose decision does not depend on the group: always cut, or never (for tests/A-B)."""

    cut: bool
    K: int = 10

    def __post_init__(self) -> None:
        if not isinstance(self.cut, (bool, np.bool_)):
            raise SrolloutError(f"FixedGate.cut must be true or false, got {self.cut!r}")
        object.__setattr__(self, "cut", bool(self.cut))
        object.__setattr__(self, "K", _as_step(self.K))

    def decide(self, signals: GroupSignals) -> bool:
        return self.cut

    def should_cut(
        self, actions: Sequence[Sequence[str]], observations: Sequence[Sequence[str]] | None = None
    ) -> bool:
        return self.cut


def gate_from_dict(d: Mapping[str, Any], source: str = "gate") -> Gate:
    """Build any registered gate kind from its dict (the parsed gate.json)."""
    if not isinstance(d, Mapping):
        raise SrolloutError(f"{source}: a gate must be a JSON object, got {type(d).__name__}")
    kind = d.get("kind")
    if kind not in _GATE_KINDS and kind in _LAZY_GATE_KINDS:
        import importlib

        importlib.import_module(_LAZY_GATE_KINDS[kind])
    if kind not in _GATE_KINDS and isinstance(kind, str):
        _entry_point_kind(kind, source)
    if kind not in _GATE_KINDS:
        known = ", ".join(sorted(set(_GATE_KINDS) | set(_LAZY_GATE_KINDS)))
        raise SrolloutError(
            f"{source}: unknown gate kind {kind!r} (known: {known}; a kind of another package "
            f"is found through an entry point of group {ENTRY_POINT_GROUP!r})"
        )
    return _GATE_KINDS[kind](d, source)


def load_gate(path: str | Path) -> Gate:
    """Read a gate.json of any registered kind. Missing/unreadable/bad files raise SrolloutError."""
    path = Path(path)
    if path.is_dir():
        path = path / "gate.json"  # a sweep run directory
    if not path.exists():
        raise SrolloutError(f"{path}: no such gate file (write one with `srollout sweep`)")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise SrolloutError(f"{path}: cannot read gate file ({type(err).__name__})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as err:
        raise SrolloutError(
            f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})"
        ) from None
    return gate_from_dict(d, str(path))


def resolve_gate(
    path: str | Path | Gate | None = None,
    *,
    K: int | None = None,
    d_L: float | None = None,
    rule: str = "r1",
    t_high: float | None = None,
    T_max: int | None = None,
) -> tuple[Gate, int]:
    """The gate every stage uses, and its step K: from a gate.json (``path``, or the gate already
    read from one), or a :class:`GateRule` from ``K``, ``d_L``, ``rule``, ``t_high``.

    One rule for K: a gate.json carries its own K (every registered kind has one; a threshold
    rule must name it) and that K is used; a loaded gate without a K is not a gate file of this
    project, so it is a SrolloutError, never a silent default. From the options, K and d_L left
    as None take the paper's operating point (10, 0.12; GateRule's defaults). With ``T_max``
    given, a K beyond it is refused (the gate could never fire).
    """
    if path is not None:
        gate = path if isinstance(path, Gate) else load_gate(path)
        k = getattr(gate, "K", None)  # a kind of another package may have none
        if k is None:
            raise SrolloutError(
                f"{'the' if isinstance(path, Gate) else path} gate has no step K (write one with "
                "`srollout sweep`)"
            )
        K = int(k)
    else:
        defaults = GateRule()
        K = defaults.K if K is None else K
        gate = GateRule(rule=rule, K=K, d_L=defaults.d_L if d_L is None else d_L, t_high=t_high)
    if T_max is not None:
        check_step(K, T_max, of="gate K" if path is not None else None)
    return gate, K


def check_step(
    step: int, T_max: int, name: str = "K", *, of: str | None = None, why: str = ""
) -> None:
    """The one check that a step lies within the step limit: ``step <= T_max``, else one
    :class:`~srollout.errors.ArgumentError` (a gate past T_max could never act).

    name: the caller's argument ``step`` is (``K``, ``k0``, ``stall_from``, ``check_K``; the CLI
    shows its flag); of: what ``step`` is when it is no argument but a gate's own field
    (``"gate K"``: the line reads ``gate K=12 is larger than T_max=10``); why: what that means,
    added after a colon."""
    if step > T_max:
        shown, values = (f"{of}={step}", {}) if of is not None else (f"{{{name}}}", {name: step})
        end = f": {why}" if why else ""
        raise ArgumentError(f"{shown} is larger than {{T_max}}{end}", T_max=T_max, **values)


def describe_gate(gate: Gate | None, K: int | None) -> dict[str, Any] | None:
    """The gate as run manifests record it: its ``to_dict()`` plus the step K (None: no gate)."""
    if gate is None:
        return None
    return {**gate.to_dict(), "K": K}


def _check_header(d: Mapping[str, Any], kind: str, source: str) -> dict[str, Any]:
    if not isinstance(d, Mapping):
        raise SrolloutError(f"{source}: a gate must be a JSON object, got {type(d).__name__}")
    if d.get("kind") != kind:
        raise SrolloutError(f"{source}: expected a {kind!r} gate, got kind {d.get('kind')!r}")
    version = d.get("version", GATE_FILE_VERSION)
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or not 1 <= version <= GATE_FILE_VERSION
    ):
        raise SrolloutError(
            f"{source}: gate file version {version!r} is not supported (this srollout reads <= "
            f"{GATE_FILE_VERSION})"
        )
    return {k: v for k, v in d.items() if k not in ("kind", "version")}


def _check_keys(
    body: Mapping[str, Any], required: Sequence[str], optional: Sequence[str], source: str
) -> None:
    missing = [k for k in required if k not in body]
    if missing:
        raise SrolloutError(f"{source}: gate is missing {', '.join(repr(k) for k in missing)}")
    unknown = sorted(set(body) - set(required) - set(optional))
    if unknown:
        raise SrolloutError(
            f"{source}: unknown gate field(s) {', '.join(repr(k) for k in unknown)}"
        )


def _fields_of(cls: type, gate: Any = None) -> dict[str, Any]:
    """A dataclass gate kind's fields (name -> Field), or with ``gate`` their values; one line
    for a kind that is no dataclass (it writes its own to_dict / from_dict)."""
    if not dataclasses.is_dataclass(cls):
        raise SrolloutError(
            f"gate kind {cls.__name__}: not a dataclass, so it defines to_dict and from_dict"
        )
    fields = {f.name: f for f in dataclasses.fields(cls)}
    return fields if gate is None else {n: getattr(gate, n) for n in fields}


def require_group_gate(gate: Any, what: str = "gate") -> Gate:
    """``gate`` if it is a group gate of the contract (:class:`Gate`, scope "group"), else one
    SrolloutError saying what it is."""
    if not isinstance(gate, Gate):
        raise SrolloutError(
            f"{what} must be a srollout gate (a subclass of srollout.core.gate.Gate: GateRule, a "
            f"loaded gate.json), got {type(gate).__name__}"
        )
    if gate.scope != "group":
        raise SrolloutError(
            f"{what} must be a group gate; a {gate.kind!r} gate ends single trajectories"
        )
    return gate


@lru_cache(maxsize=64)
def _cached_rule(rule: str, K: int, d_L: float, t_high: float | None) -> GateRule:
    return GateRule(rule=rule, K=K, d_L=d_L, t_high=t_high)


def should_cut(
    actions_by_traj: Sequence[Sequence[str]],
    K: int = 10,
    d_L: float = 0.12,
    observations: Sequence[Sequence[str]] | None = None,
    rule: str = "r1",
    t_high: float | None = None,
) -> bool:
    """One call for your own trainer: cut this group at step K?

    actions_by_traj: G >= 2 lists of normalised actions (trajectory i's actions in step order; a
    list shorter than K = that trajectory ended). Returns True iff the gate fires (R1: d_K < d_L;
    R3: also τ_K >= t_high). Bad parameters raise SrolloutError.
    """
    try:
        gate = _cached_rule(rule, K, d_L, t_high)
    except TypeError:  # unhashable argument: let the validation say what is wrong
        gate = GateRule(rule=rule, K=K, d_L=d_L, t_high=t_high)
    return gate.should_cut(actions_by_traj, observations)
