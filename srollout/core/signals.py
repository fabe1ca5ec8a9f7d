"""The seven mid-rollout divergence signals of a group at step K (paper §4.2, App. "Full
mid-rollout signal definitions").

A group is G partial trajectories; ``actions[i]`` is the (normalised) action sequence of
trajectory i in step order. At step K every signal looks at the first K steps only, prefixes
END-padded to length K (:data:`END`). The seven definitions, in [0, 1] with 0 = the G
trajectories agree: docs/glossary.md ("signal"). Conventions beyond it: two empty bigram sets
(possible only at K = 1) have Jaccard distance 0; obs_unique_ratio is nan without observations.

Edit distance compares whole actions as symbols (:func:`_edit_distance_sum`) by their Python
hash, so two different actions whose 64-bit string hashes collide would count as equal (odds
~ 2^-64 per pair of actions; accepted).

Speed: :func:`compute_signals` collapses identical padded prefixes (converged groups, the ones
the gate cuts, have few) and weighs the pairwise quantities by their counts, vectorised from
``_CDIST_FROM`` / ``_NUMPY_JACCARD_FROM`` distinct prefixes on. ``benchmarks/bench_core.py``
holds it to ≤ 50 µs per group at G=8, K=10 and ≤ 2 ms at G=64 (docs/bench/core.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, combinations, count, pairwise, starmap
from operator import mul

import numpy as np
from rapidfuzz.distance import Levenshtein as _rf_levenshtein
from rapidfuzz.process import cdist

from srollout.errors import SrolloutError
from srollout.signal_names import SIGNAL_NAMES

try:  # Counter's C counting loop, without Counter's Python-level overhead
    from collections import _count_elements  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - other Python implementations

    def _count_elements(mapping: dict, iterable: Iterable) -> None:
        for x in iterable:
            mapping[x] = mapping.get(x, 0) + 1


END = "<END>"

# From this many distinct prefixes on, edit distances go to one rapidfuzz.process.cdist call
# (the C++ engine behind the Levenshtein package) and bigram Jaccard to a numpy incidence
# product; below, per-pair work is cheaper than their setup (measured crossovers at K = 10:
# cdist from U ~ 7, ~5 at K = 20; numpy Jaccard from U ~ 12, ~10 at K = 30).
_CDIST_FROM = 7
_NUMPY_JACCARD_FROM = 12
_END_PAD_LEN = 64


class GroupSignals:
    """The agreement signals of one group at one step K under their registered names (floats in
    [0, 1]; ``sig.termination_fraction`` or ``sig.as_dict()``); ``steps``: the step signals of
    :mod:`srollout.core.step_signals` as ``(name, value)`` pairs, when the caller computed them
    (the engine does). Built positionally in the order of :data:`AGREEMENT_SIGNALS` or by name;
    immutable."""

    __slots__ = ("_values", "steps")

    def __init__(self, *values: float, steps: tuple[tuple[str, float], ...] = (), **named: float):
        if len(values) > len(SIGNAL_NAMES):
            raise SrolloutError(f"{len(values)} signal values for {len(SIGNAL_NAMES)} signals")
        given = dict(zip(SIGNAL_NAMES, values, strict=False))
        twice = set(given) & set(named)
        unknown = set(named) - set(SIGNAL_NAMES)
        missing = [n for n in SIGNAL_NAMES if n not in given and n not in named]
        if twice or unknown or missing:
            what = ", ".join(
                f"{label}: {', '.join(sorted(names))}"
                for label, names in (("twice", twice), ("unknown", unknown), ("missing", missing))
                if names
            )
            raise SrolloutError(f"GroupSignals needs each agreement signal once ({what})")
        given.update(named)
        object.__setattr__(self, "_values", {n: given[n] for n in SIGNAL_NAMES})
        object.__setattr__(self, "steps", tuple(steps))

    def __getattr__(self, name: str) -> float:
        try:
            return object.__getattribute__(self, "_values")[name]
        except KeyError:
            raise AttributeError(f"GroupSignals has no signal {name!r}") from None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("GroupSignals is immutable (with_steps makes a new one)")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GroupSignals):
            return NotImplemented
        return (self._values, self.steps) == (other._values, other.steps)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple:  # pickled by value (Ray ships records between processes)
        return (_group_signals, (self._values, self.steps))

    def __repr__(self) -> str:
        return f"GroupSignals({', '.join(f'{k}={v!r}' for k, v in self.as_dict().items())})"

    @classmethod
    def of(cls, values: Sequence[float]) -> GroupSignals:
        """From every agreement signal's value in the registry's order, unchecked (the engine's
        path: :func:`compute_signals`)."""
        sig = object.__new__(cls)
        object.__setattr__(sig, "_values", dict(zip(SIGNAL_NAMES, values, strict=True)))
        object.__setattr__(sig, "steps", ())
        return sig

    def with_steps(self, steps: tuple[tuple[str, float], ...]) -> GroupSignals:
        """The same agreement signals with these step signals."""
        return GroupSignals(**self._values, steps=steps)

    def as_dict(self) -> dict[str, float]:
        """``{signal name: value}`` in the order of ``srollout.schemas.SIGNAL_NAMES``, then the
        step signals it holds."""
        return {**self._values, **dict(self.steps)}


def _group_signals(values: dict[str, float], steps: tuple) -> GroupSignals:
    return GroupSignals(**values, steps=steps)


def _check_group(actions: Sequence[Sequence[str]], K: int) -> int:
    """Validate the group and K; return G."""
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)):
        raise SrolloutError(f"K must be an integer step >= 1, got {K!r}")
    if K < 1:
        raise SrolloutError(f"K must be >= 1, got {K}")
    if isinstance(actions, str):
        raise SrolloutError(
            "actions must be a list of action lists (one per trajectory), got one string"
        )
    G = len(actions)
    if G < 2:
        raise SrolloutError(f"a group needs G >= 2 trajectories to measure divergence, got {G}")
    if str in set(map(type, actions)):
        # A string here would be sliced into characters and silently give nonsense signals.
        i = next(i for i, a in enumerate(actions) if isinstance(a, str))
        raise SrolloutError(f"actions[{i}] is a string; pass each trajectory as a list of actions")
    return G


_END_PAD = (END,) * _END_PAD_LEN


def _padded_prefixes(actions: Sequence[Sequence[str]], K: int) -> list[tuple[str, ...]]:
    """The G K-prefixes as tuples of K actions, END-padded (ended differs from still acting)."""
    pad = _END_PAD if K <= _END_PAD_LEN else (END,) * K
    return [tuple(a[:K]) if len(a) >= K else tuple(a) + pad[: K - len(a)] for a in actions]


def _prefix_counts(
    actions: Sequence[Sequence[str]], K: int, prefixes: list[tuple[str, ...]] | None = None
) -> dict[tuple[str, ...], int]:
    """Distinct END-padded K-prefixes and how many trajectories share each.

    Padded before counting: an action spelled like END makes two unpadded prefixes one padded
    prefix ([] and ["<END>"] at K=1), and the signals are defined on padded prefixes.
    ``prefixes``: the ``_padded_prefixes(actions, K)`` a caller already holds.
    """
    counts: dict[tuple[str, ...], int] = {}
    _count_elements(counts, prefixes if prefixes is not None else _padded_prefixes(actions, K))
    return counts


def _edit_distance_sum(prefixes: Sequence[tuple[str, ...]], counts: Sequence[int]) -> float:
    """Sum over trajectory pairs of the action-level edit distance, via distinct prefixes.

    prefixes: U distinct padded prefixes (tuples of actions); counts: [U] trajectories sharing
    each. The Levenshtein package compares sequences of hashable items element by element, so
    one action is one symbol ("go to desk 1" vs "go to desk 2" is one substitution).
    """
    U = len(prefixes)
    if U < 2:
        return 0.0
    if U >= _CDIST_FROM:
        # The same algorithm as Levenshtein.distance, all U*U pairs in one C call.
        dist = cdist(prefixes, prefixes, scorer=_rf_levenshtein.distance, workers=1)  # U x U int32
        if len(counts) == sum(counts):  # every prefix distinct: plain sum over pairs
            return float(dist.sum()) / 2.0
        c = np.asarray(counts, dtype=np.float64)
        return float(c @ dist @ c) / 2.0
    # rapidfuzz's distance directly: Levenshtein.distance is a Python wrapper around this very
    # function (same algorithm, same result) that costs about as much again per call.
    dists = starmap(_rf_levenshtein.distance, combinations(prefixes, 2))
    if len(counts) == sum(counts):
        return float(sum(dists))
    return float(sum(map(mul, starmap(mul, combinations(counts, 2)), dists)))


# _BITS[k] = 1 << k: a new bigram's bit is one tuple read instead of a shift. Replaced (never
# mutated, so concurrent callers each see a complete table) when a group needs more bits.
_BITS: tuple[int, ...] = tuple(1 << k for k in range(256))


def _bigram_bitsets(prefixes: Sequence[tuple[str, ...]]) -> list[int]:
    """Each padded prefix's bigram set as a bitset (bit k = the group's k-th distinct bigram).

    prefixes: U padded prefixes of equal length K >= 2. An intersection of two sets is then one
    AND and a popcount. A plain loop with one dict.setdefault per bigram: at G=8 it measured
    faster than map/reduce chains, per-prefix Python sets and numpy (per-call overhead dominates
    for 28 pairs of ~9 bigrams).
    """
    global _BITS
    n_max = len(prefixes) * (len(prefixes[0]) - 1)  # bound on the number of distinct bigrams
    bits = _BITS
    if len(bits) < n_max:
        bits = _BITS = tuple(1 << k for k in range(n_max))
    bit: dict[tuple[str, str], int] = {}
    setdefault = bit.setdefault
    masks = []
    for p in prefixes:
        mask = 0
        for bigram in pairwise(p):
            # A bigram seen before gets its bit back; a new one takes the next free bit.
            mask |= setdefault(bigram, bits[len(bit)])
        masks.append(mask)
    return masks


def _bigram_jaccard_sum(prefixes: Sequence[tuple[str, ...]], counts: Sequence[int]) -> float:
    """Sum over trajectory pairs of the bigram Jaccard distance, via distinct prefixes.

    prefixes: U distinct padded prefixes of equal length K; counts: [U].
    """
    U = len(prefixes)
    if U < 2 or len(prefixes[0]) < 2:
        # Identical prefixes, or K = 1 (no bigrams: two empty sets have distance 0).
        return 0.0
    if U >= _NUMPY_JACCARD_FROM:
        return _bigram_jaccard_sum_numpy(prefixes, counts)
    masks = _bigram_bitsets(prefixes)
    sizes = [m.bit_count() for m in masks]
    # Sum over pairs of the Jaccard *similarity* |B_i ∩ B_j| / |B_i ∪ B_j|; pairs sharing no
    # bigram add nothing.
    similarity = 0.0
    if len(counts) == sum(counts):  # every prefix distinct: unit weights
        for i in range(U - 1):
            m_i, n_i = masks[i], sizes[i]
            for j in range(i + 1, U):
                inter = (m_i & masks[j]).bit_count()
                if inter:
                    similarity += inter / (n_i + sizes[j] - inter)
    else:
        for i in range(U - 1):
            m_i, n_i, c_i = masks[i], sizes[i], counts[i]
            for j in range(i + 1, U):
                inter = (m_i & masks[j]).bit_count()
                if inter:
                    similarity += c_i * counts[j] * inter / (n_i + sizes[j] - inter)
    n = sum(counts)
    n_pairs = (n * n - sum(map(mul, counts, counts))) // 2
    return n_pairs - similarity


# (U, K) -> (row, position) indices of the within-prefix bigrams in the flattened group.
_BIGRAM_INDEX: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def _bigram_jaccard_sum_numpy(prefixes: Sequence[tuple[str, ...]], counts: Sequence[int]) -> float:
    """:func:`_bigram_jaccard_sum` for many distinct prefixes: one bigram incidence product.

    Each bigram's column is the position of its first occurrence in the flattened group (the U-1
    bigrams that straddle two prefixes get positions too, never filled); inc[u, col] = 1 marks
    prefix u's set (a repeated bigram fills the same cell: set semantics); intersections =
    inc @ inc.T, exact in float32 (integer counts <= K).
    """
    U, K = len(prefixes), len(prefixes[0])
    n = U * K - 1
    first = {}.setdefault  # bigram -> the first position offered for it
    cols = np.fromiter(
        map(first, pairwise(chain.from_iterable(prefixes)), count()), dtype=np.intp, count=n
    )
    index = _BIGRAM_INDEX.get((U, K))
    if index is None:
        pos = (np.arange(U)[:, None] * K + np.arange(K - 1)).ravel()
        index = _BIGRAM_INDEX.setdefault((U, K), (np.repeat(np.arange(U), K - 1), pos))
    inc = np.zeros((U, n), dtype=np.float32)
    inc[index[0], cols[index[1]]] = 1.0
    inter = (inc @ inc.T).astype(np.float64)
    size = inter.diagonal()
    # Padded prefixes of length >= 2 have >= 1 bigram, so every union is >= 1.
    sim = inter / (size[:, None] + size - inter)  # diagonal = 1
    if len(counts) == sum(counts):
        return U * (U - 1) / 2 - (float(sim.sum()) - U) / 2
    c = np.asarray(counts, dtype=np.float64)
    same = float(c @ c)
    return (float(c.sum()) ** 2 - same) / 2 - (float(c @ sim @ c) - same) / 2


def prefix_edit_distance(actions: Sequence[Sequence[str]], K: int) -> float:
    """d_K alone: mean pairwise action-level Levenshtein distance of the END-padded K-prefixes / K.

    actions: G action lists (any lengths; only the first K are used). Returns a float in [0, 1].
    Raises SrolloutError if G < 2 or K < 1.
    """
    return prefix_edit_distance_mean(group_at_K(actions, K))


def _unique_ratio(items: Sequence[str], G: int) -> float:
    return len(set(items)) / G


def _entropy(items: Sequence[str], G: int) -> float:
    """Shannon entropy of G symbols / log G."""
    counts: dict[str, int] = {}
    _count_elements(counts, items)
    if len(counts) == 1:
        return 0.0
    entropy = 0.0
    for c in counts.values():
        p = c / G
        entropy -= p * math.log(p)
    return min(entropy / math.log(G), 1.0)  # rounding can put a uniform split a hair above log G


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs ~1 µs a field
class GroupAtK:
    """What every agreement signal of a group at step K reads, computed once: ``prefixes`` the
    G END-padded K-prefixes, ``counts`` each distinct prefix and how many trajectories share it,
    ``lengths`` the G trajectories' action counts, ``a_K`` and ``o_K`` the G actions at step K
    and the observations they acted on (END for a trajectory that ended before step K; ``o_K``
    None when no observations were given)."""

    G: int
    K: int
    prefixes: list[tuple[str, ...]]
    distinct: list[tuple[str, ...]]
    weights: list[int]
    lengths: list[int]
    a_K: list[str]
    o_K: list[str] | None

    n_pairs: float  # G (G - 1) / 2


def prefix_edit_distance_mean(g: GroupAtK) -> float:
    if len(g.distinct) == 1:
        return 0.0
    return _edit_distance_sum(g.distinct, g.weights) / (g.K * g.n_pairs)


def action_bigram_jaccard_mean(g: GroupAtK) -> float:
    if len(g.distinct) == 1:
        return 0.0
    return _bigram_jaccard_sum(g.distinct, g.weights) / g.n_pairs


def obs_unique_ratio(g: GroupAtK) -> float:
    return math.nan if g.o_K is None else _unique_ratio(g.o_K, g.G)


# name -> the signal's function of the group at K; the order (and the names) of
# srollout.signal_names.AGREEMENT_UNITS, the signals table's contract. A new agreement signal is
# one function of a GroupAtK, its entry here, its name and unit there, and its test.
AGREEMENT_SIGNALS: dict[str, Callable[[GroupAtK], float]] = {
    "prefix_edit_distance_mean": prefix_edit_distance_mean,
    "action_bigram_jaccard_mean": action_bigram_jaccard_mean,
    "unique_prefix_ratio": lambda g: len(g.distinct) / g.G,
    "unique_action_ratio": lambda g: _unique_ratio(g.a_K, g.G),
    "action_entropy": lambda g: _entropy(g.a_K, g.G),
    "obs_unique_ratio": obs_unique_ratio,
    "termination_fraction": lambda g: sum(1 for n in g.lengths if n < g.K) / g.G,
}


def group_at_K(
    actions: Sequence[Sequence[str]],
    K: int,
    observations: Sequence[Sequence[str]] | None = None,
    done: Sequence[bool] | None = None,
) -> GroupAtK:
    """Check a group (see :func:`compute_signals`) and compute what its signals at K read."""
    G = _check_group(actions, K)
    lens = [len(a) for a in actions]
    prefixes = _padded_prefixes(actions, K)
    if done is not None:
        if len(done) != G:
            raise SrolloutError(f"done has {len(done)} flags for a group of G={G} trajectories")
        for i, n in enumerate(lens):
            if n < K and not done[i]:
                raise SrolloutError(
                    f"trajectory {i} has only {n} actions at K={K} but is not done; "
                    "signals at step K need K actions from every running trajectory"
                )
    o_k = None
    if observations is not None:
        if isinstance(observations, str) or len(observations) != G:
            raise SrolloutError(f"observations must hold one list per trajectory (G={G})")
        if str in set(map(type, observations)):
            raise SrolloutError(
                "observations must hold one list of observations per trajectory, got a string"
            )
        try:
            o_k = [observations[i][K - 1] if lens[i] >= K else END for i in range(G)]
        except (IndexError, TypeError):
            raise SrolloutError(_observation_error(observations, lens, K)) from None
    counts = _prefix_counts(actions, K, prefixes)
    a_k = [p[K - 1] for p in prefixes]
    distinct, weights = list(counts), list(counts.values())
    return GroupAtK(G, K, prefixes, distinct, weights, lens, a_k, o_k, G * (G - 1) / 2)


def compute_signals(
    actions: Sequence[Sequence[str]],
    K: int,
    observations: Sequence[Sequence[str]] | None = None,
    done: Sequence[bool] | None = None,
) -> GroupSignals:
    """Every agreement signal of :data:`AGREEMENT_SIGNALS` of a group at step K.

    Args:
        actions: G action lists, ``actions[i][t]`` = a_{i,t+1}; a list shorter than K means the
            trajectory ended before step K. Only the first K actions are used.
        K: the evaluation step (1-based), K >= 1.
        observations: optional G lists, ``observations[i][t]`` = the observation trajectory i
            acted on at step t+1 (o_1 = initial observation); needs at least min(K, len(actions[i]))
            entries. Without it ``obs_unique_ratio`` is nan.
        done: optional G flags (trajectory has ended), only used to check that every trajectory
            with fewer than K actions is marked done.

    Returns:
        GroupSignals. Raises SrolloutError on G < 2, K < 1 or inconsistent inputs.
    """
    g = group_at_K(actions, K, observations, done)
    return GroupSignals.of([fn(g) for fn in AGREEMENT_SIGNALS.values()])


def _observation_error(observations: Sequence[Sequence[str]], lens: Sequence[int], K: int) -> str:
    """The one-line message for observations that do not cover step K."""
    for i, (o, n) in enumerate(zip(observations, lens, strict=False)):
        if n >= K and (not hasattr(o, "__len__") or len(o) < K):
            got = len(o) if hasattr(o, "__len__") else type(o).__name__
            return f"observations[{i}] needs the {K} observations the agent acted on, got {got}"
    return "observations must be one list of observation strings per trajectory"


def termination_fraction(actions: Sequence[Sequence[str]], K: int) -> float:
    """τ_K alone: share of the G trajectories with fewer than K actions (ended before step K)."""
    G = _check_group(actions, K)
    return sum(1 for a in actions if len(a) < K) / G
