"""The fast paths of srollout.core.signals against a straightforward reference, per signal.

test_signals.py already checks small groups over a 6-action vocabulary; here the groups cover
every code path of compute_signals: unit and weighted (duplicate prefixes) pair sums, the
per-pair and cdist edit distances (U < 7 and U >= 7), the bitset and numpy bigram Jaccard
(U < 12 and U >= 12), early-ended trajectories (END padding), repeated bigrams inside a prefix,
and an action spelled like the END symbol itself.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srollout.core import signals as S
from srollout.core.signals import END, compute_signals

# --------------------------------------------------------------------------------------------
# Reference: each signal written from its definition (DESIGN.md), one function per signal.


def ref_padded(actions, K):
    """END-padded K-prefixes, as lists."""
    return [list(a[:K]) + [END] * (K - len(a[:K])) for a in actions]


def ref_levenshtein(x, y):
    """Edit distance over symbols (insert, delete, substitute; cost 1 each), full DP table."""
    d = [[0] * (len(y) + 1) for _ in range(len(x) + 1)]
    for i in range(len(x) + 1):
        d[i][0] = i
    for j in range(len(y) + 1):
        d[0][j] = j
    for i in range(1, len(x) + 1):
        for j in range(1, len(y) + 1):
            d[i][j] = min(
                d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (x[i - 1] != y[j - 1])
            )
    return d[len(x)][len(y)]


def ref_d_k(actions, K):
    P = ref_padded(actions, K)
    pairs = list(itertools.combinations(P, 2))
    return sum(ref_levenshtein(p, q) / max(len(p), len(q)) for p, q in pairs) / len(pairs)


def ref_jaccard(actions, K):
    P = ref_padded(actions, K)
    total, pairs = 0.0, list(itertools.combinations(P, 2))
    for p, q in pairs:
        A = {(p[t], p[t + 1]) for t in range(len(p) - 1)}
        B = {(q[t], q[t + 1]) for t in range(len(q) - 1)}
        total += 0.0 if not (A | B) else 1.0 - len(A & B) / len(A | B)
    return total / len(pairs)


def ref_unique_prefix(actions, K):
    return len({tuple(p) for p in ref_padded(actions, K)}) / len(actions)


def ref_a_k(actions, K):
    return [a[K - 1] if len(a) >= K else END for a in actions]


def ref_unique_action(actions, K):
    return len(set(ref_a_k(actions, K))) / len(actions)


def ref_entropy(actions, K):
    a_k, G = ref_a_k(actions, K), len(actions)
    h = -sum(a_k.count(x) / G * math.log(a_k.count(x) / G) for x in set(a_k))
    return h / math.log(G)


def ref_obs_unique(actions, observations, K):
    o_k = {o[K - 1] if len(a) >= K else END for a, o in zip(actions, observations, strict=True)}
    return len(o_k) / len(actions)


def ref_termination(actions, K):
    return sum(1 for a in actions if len(a) < K) / len(actions)


# --------------------------------------------------------------------------------------------
# Groups: trajectories drawn from a few "plans" (so duplicates and shared bigrams are common)
# or at random from a larger vocabulary.

VOCAB = [f"go to desk {i}" for i in range(1, 9)] + ["look", "inventory", "open drawer 1", END]


@st.composite
def group_and_k(draw, max_g=40):
    K = draw(st.integers(1, 12))
    n_plans = draw(st.integers(1, 4))
    plans = [
        draw(st.lists(st.sampled_from(VOCAB), min_size=K, max_size=K + 3)) for _ in range(n_plans)
    ]
    G = draw(st.integers(2, max_g))
    actions = []
    for _ in range(G):
        if draw(st.booleans()):
            a = list(draw(st.sampled_from(plans)))
            if draw(st.booleans()):  # one substitution somewhere in the plan
                t = draw(st.integers(0, len(a) - 1))
                a[t] = draw(st.sampled_from(VOCAB))
        else:
            a = draw(st.lists(st.sampled_from(VOCAB), min_size=0, max_size=K + 2))
        if draw(st.integers(0, 4)) == 0:  # ended early
            a = a[: draw(st.integers(0, K))]
        actions.append(a)
    return actions, K


def _check(actions, K):
    obs = [[f"obs {x} at {t % 3}" for t, x in enumerate(a)] for a in actions]
    s = compute_signals(actions, K, obs)
    want = {
        "prefix_edit_distance_mean": ref_d_k(actions, K),
        "action_bigram_jaccard_mean": ref_jaccard(actions, K),
        "unique_prefix_ratio": ref_unique_prefix(actions, K),
        "unique_action_ratio": ref_unique_action(actions, K),
        "action_entropy": ref_entropy(actions, K),
        "obs_unique_ratio": ref_obs_unique(actions, obs, K),
        "termination_fraction": ref_termination(actions, K),
    }
    for name, value in want.items():
        assert getattr(s, name) == pytest.approx(value, abs=1e-12), name


@settings(max_examples=120, deadline=None)
@given(group_and_k(max_g=12))
def test_small_groups_match_reference(group):
    # G <= 12: the per-pair edit distance (U < 7) and the bitset Jaccard (U < 12) paths.
    _check(*group)


@settings(max_examples=25, deadline=None)
@given(group_and_k(max_g=40))
def test_large_groups_match_reference(group):
    # Up to G = 40: also the cdist edit distance and the numpy Jaccard paths.
    _check(*group)


def test_each_jaccard_path_is_exercised():
    # Guard for the strategies above: the thresholds they rely on still split the paths.
    assert S._CDIST_FROM <= 12 and S._NUMPY_JACCARD_FROM <= 40
    # Hand-worked: P1 = a b a b (bigrams {ab, ba}), P2 = a b c c ({ab, bc, cc}); one shared of
    # four -> Jaccard distance 3/4; edit distance 2 of 4 -> d_K = 1/2.
    s = compute_signals([["a", "b", "a", "b"], ["a", "b", "c", "c"]], 4)
    assert s.action_bigram_jaccard_mean == pytest.approx(0.75)
    assert s.prefix_edit_distance_mean == pytest.approx(0.5)
