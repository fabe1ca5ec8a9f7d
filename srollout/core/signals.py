"""The seven mid-rollout divergence signals of a group at step K (paper §4.2, App. "Full
mid-rollout signal definitions").

A group is G partial trajectories; ``actions[i]`` is the (normalised) action sequence of
trajectory i in step order. At step K every signal looks at the first K steps only:

- prefixes shorter than K (the trajectory ended before step K) are padded with :data:`END` to
  length K, so "finished" differs from "still acting" (the convention of the paper's numbers);
- a_K, the action at step K, is END for a trajectory that ended before step K; o_K, the
  observation the agent acted on to choose a_K (o_1 = initial observation), likewise.

=========================== ====== ==========================================================
signal                      symbol definition (all in [0, 1]; 0 = the G trajectories agree)
=========================== ====== ==========================================================
prefix_edit_distance_mean   d_K    mean over the C(G,2) pairs of Levenshtein(a_i,1:K, a_j,1:K)
                                   over actions (one action = one symbol), / the longer length
                                   (= K after padding)
action_bigram_jaccard_mean         mean over pairs of 1 - |B_i ∩ B_j| / |B_i ∪ B_j|, B_i the set
                                   of consecutive action pairs of the padded prefix (two empty
                                   sets, possible only at K = 1, have distance 0)
unique_prefix_ratio                #distinct padded prefixes / G
unique_action_ratio                #distinct a_K / G
action_entropy                     Shannon entropy of the a_K distribution / log G
obs_unique_ratio                   #distinct o_K / G (nan when no observations are given)
termination_fraction        τ_K    #(trajectories with fewer than K actions) / G
=========================== ====== ==========================================================

Edit distance: the Levenshtein package (and ``rapidfuzz.process.cdist``, the C++ engine it
wraps) accepts sequences of hashable items and compares them item by item, so the padded
action tuples are passed as they are: one action is one symbol ("go to desk 1" vs "go to desk
2" is one substitution, not one character). Items are compared by their Python hash, so two
different actions whose 64-bit string hashes collide would count as equal (odds ~ 2^-64 per
pair of actions; accepted).

Speed: the gate runs these at step K of every group, so :func:`compute_signals` first collapses
identical padded prefixes (converged groups, the ones the gate cuts, have few distinct prefixes)
and computes pairwise quantities over distinct prefixes weighted by their counts. Edit
distances: one rapidfuzz call per pair for a handful of distinct prefixes, one ``cdist`` call
for all pairs from seven on. Bigram Jaccard: each prefix's bigram set as a Python-int bitset
(one dict lookup per bigram, then AND + popcount per pair) below a dozen distinct prefixes, a
numpy incidence product beyond. ``benchmarks/bench_core.py`` measures it against the targets
(≤ 50 µs per group at G=8, K=10; ≤ 2 ms at G=64) and writes docs/bench/core.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, combinations, count, pairwise, starmap
from operator import mul

import numpy as np
from rapidfuzz.distance import Levenshtein as _rf_levenshtein
from rapidfuzz.process import cdist

from srollout.errors import SrolloutError

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


@dataclass(frozen=True, slots=True)
class GroupSignals:
    """The seven signals of one group at one step K, under the paper's names (floats in [0, 1]);
    ``steps``: the step signals of :mod:`srollout.core.step_signals` as ``(name, value)`` pairs,
    when the caller computed them (the engine does)."""

    prefix_edit_distance_mean: float
    action_bigram_jaccard_mean: float
    unique_prefix_ratio: float
    unique_action_ratio: float
    action_entropy: float
    obs_unique_ratio: float
    termination_fraction: float
    steps: tuple[tuple[str, float], ...] = ()

    def as_dict(self) -> dict[str, float]:
        """``{signal name: value}`` in the order of ``srollout.schemas.SIGNAL_NAMES``, then the
        step signals it holds."""
        return {
            "prefix_edit_distance_mean": self.prefix_edit_distance_mean,
            "action_bigram_jaccard_mean": self.action_bigram_jaccard_mean,
            "unique_prefix_ratio": self.unique_prefix_ratio,
            "unique_action_ratio": self.unique_action_ratio,
            "action_entropy": self.action_entropy,
            "obs_unique_ratio": self.obs_unique_ratio,
            "termination_fraction": self.termination_fraction,
            **dict(self.steps),
        }


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
    G = _check_group(actions, K)
    counts = _prefix_counts(actions, K)
    if len(counts) == 1:
        return 0.0
    return _edit_distance_sum(list(counts), list(counts.values())) / (K * G * (G - 1) / 2)


def _unique_ratio_and_entropy(items: Sequence[str], G: int) -> tuple[float, float]:
    """(#distinct / G, Shannon entropy / log G) of G symbols."""
    counts: dict[str, int] = {}
    _count_elements(counts, items)
    if len(counts) == 1:
        return 1 / G, 0.0
    entropy = 0.0
    for c in counts.values():
        p = c / G
        entropy -= p * math.log(p)
    # Clip: rounding can put a uniform split a hair above log G.
    return len(counts) / G, min(entropy / math.log(G), 1.0)


def compute_signals(
    actions: Sequence[Sequence[str]],
    K: int,
    observations: Sequence[Sequence[str]] | None = None,
    done: Sequence[bool] | None = None,
) -> GroupSignals:
    """All seven signals of a group at step K.

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
    G = _check_group(actions, K)
    lens = [len(a) for a in actions]
    terminated = len([n for n in lens if n < K])  # trajectories that ended before step K
    prefixes = _padded_prefixes(actions, K)
    counts = _prefix_counts(actions, K, prefixes)
    U = len(counts)

    if done is not None:
        if len(done) != G:
            raise SrolloutError(f"done has {len(done)} flags for a group of G={G} trajectories")
        for i, n in enumerate(lens):
            if n < K and not done[i]:
                raise SrolloutError(
                    f"trajectory {i} has only {n} actions at K={K} but is not done; "
                    "signals at step K need K actions from every running trajectory"
                )

    if U == 1:
        d_k = jaccard = 0.0
    else:
        distinct, c = list(counts), list(counts.values())
        n_pairs = G * (G - 1) / 2
        d_k = _edit_distance_sum(distinct, c) / (K * n_pairs)
        jaccard = _bigram_jaccard_sum(distinct, c) / n_pairs

    # a_K is the last action of the padded prefix: END for a trajectory that ended before K.
    unique_action, entropy = _unique_ratio_and_entropy([p[K - 1] for p in prefixes], G)

    if observations is None:
        obs_unique = math.nan
    else:
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
        obs_unique = len(set(o_k)) / G

    return GroupSignals(
        prefix_edit_distance_mean=d_k,
        action_bigram_jaccard_mean=jaccard,
        unique_prefix_ratio=U / G,
        unique_action_ratio=unique_action,
        action_entropy=entropy,
        obs_unique_ratio=obs_unique,
        termination_fraction=terminated / G,
    )


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
