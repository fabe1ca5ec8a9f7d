"""Unit tests of srollout.core.signals: hand-worked groups, a naive reference, properties."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import Levenshtein
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srollout.core import signals as S
from srollout.core.signals import (
    AGREEMENT_SIGNALS,
    END,
    GroupSignals,
    compute_signals,
    group_at_K,
    prefix_edit_distance,
)
from srollout.errors import SrolloutError

# --------------------------------------------------------------------------------------------
# A naive reference: the definitions written as plainly as possible (DP edit distance over
# action lists, Python sets), to compare the fast paths against.


def _pad(a, K):
    p = list(a[:K])
    return p + [END] * (K - len(p))


def _lev(x, y):
    d = list(range(len(y) + 1))
    for i, xi in enumerate(x, 1):
        prev, d[0] = d[0], i
        for j, yj in enumerate(y, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (xi != yj))
    return d[len(y)]


def _bigrams(p):
    return {(p[t], p[t + 1]) for t in range(len(p) - 1)}


def naive_signals(actions, K, observations=None):
    G = len(actions)
    P = [_pad(a, K) for a in actions]
    pairs = list(itertools.combinations(range(G), 2))
    d = sum(_lev(P[i], P[j]) / max(len(P[i]), len(P[j])) for i, j in pairs) / len(pairs)

    def jd(i, j):
        A, B = _bigrams(P[i]), _bigrams(P[j])
        return 0.0 if not A and not B else 1 - len(A & B) / len(A | B)

    jac = sum(jd(i, j) for i, j in pairs) / len(pairs)
    a_k = [a[K - 1] if len(a) >= K else END for a in actions]
    counts = {x: a_k.count(x) for x in set(a_k)}
    ent = -sum(c / G * math.log(c / G) for c in counts.values()) / math.log(G)
    if observations is None:
        obs = math.nan
    else:
        obs = (
            len(
                {
                    o[K - 1] if len(a) >= K else END
                    for a, o in zip(actions, observations, strict=False)
                }
            )
            / G
        )
    return GroupSignals(
        prefix_edit_distance_mean=d,
        action_bigram_jaccard_mean=jac,
        unique_prefix_ratio=len({tuple(p) for p in P}) / G,
        unique_action_ratio=len(counts) / G,
        action_entropy=ent,
        obs_unique_ratio=obs,
        termination_fraction=sum(len(a) < K for a in actions) / G,
    )


def _assert_close(got: GroupSignals, want: GroupSignals) -> None:
    for name, value in want.as_dict().items():
        g = getattr(got, name)
        if math.isnan(value):
            assert math.isnan(g), name
        else:
            assert g == pytest.approx(value, abs=1e-12), name


# --------------------------------------------------------------------------------------------
# Hand-worked values.


def test_three_trajectory_group_by_hand():
    # K = 3, actions [a,b,c], [a,b,d], [a] -> padded prefixes P1=abc, P2=abd, P3=a·E·E.
    # d_K: lev(P1,P2)=1, lev(P1,P3)=2, lev(P2,P3)=2, each /3 -> (1+2+2)/3/3 = 5/9.
    # bigrams: B1={ab,bc}, B2={ab,bd}, B3={aE,EE}; Jaccard distances 1-1/3, 1, 1 -> 8/9.
    # unique prefixes 3/3; a_K = c, d, END -> unique 3/3, entropy log3/log3 = 1.
    # o_K = y, y, END -> 2/3. tau_K: only trajectory 3 has < 3 actions -> 1/3.
    actions = [["a", "b", "c"], ["a", "b", "d"], ["a"]]
    observations = [["o1", "x", "y"], ["o1", "x", "y"], ["o1"]]
    s = compute_signals(actions, 3, observations)
    assert s.prefix_edit_distance_mean == pytest.approx(5 / 9)
    assert s.action_bigram_jaccard_mean == pytest.approx(8 / 9)
    assert s.unique_prefix_ratio == pytest.approx(1.0)
    assert s.unique_action_ratio == pytest.approx(1.0)
    assert s.action_entropy == pytest.approx(1.0)
    assert s.obs_unique_ratio == pytest.approx(2 / 3)
    assert s.termination_fraction == pytest.approx(1 / 3)
    assert prefix_edit_distance(actions, 3) == pytest.approx(5 / 9)


def test_seven_to_one_split_entropy():
    # H = -(7/8 ln 7/8 + 1/8 ln 1/8) = 0.3768; / ln 8 = 0.1812 (DESIGN.md's worked value).
    actions = [["look", "go to desk 1"]] * 7 + [["look", "go to desk 2"]]
    s = compute_signals(actions, 2)
    assert s.action_entropy == pytest.approx(0.1812, abs=5e-5)
    assert round(s.action_entropy, 3) == 0.181
    assert s.unique_action_ratio == pytest.approx(2 / 8)
    # 7 differing pairs of 28, each 1 edit over K=2 steps.
    assert s.prefix_edit_distance_mean == pytest.approx(7 * 0.5 / 28)


def test_identical_prefixes_give_zero_divergence():
    # Identical first K actions; what happens after K must not matter.
    base = ["go to desk 1", "open drawer 1", "take pen 1 from drawer 1"]
    actions = [base + ["go to shelf 1"], base + ["look"], base, base + ["inventory", "look"]]
    s = compute_signals(actions, 3)
    assert s.prefix_edit_distance_mean == 0.0
    assert s.action_bigram_jaccard_mean == 0.0
    assert s.unique_prefix_ratio == pytest.approx(1 / 4)
    assert s.unique_action_ratio == pytest.approx(1 / 4)
    assert s.action_entropy == 0.0
    assert s.termination_fraction == 0.0


def test_edit_distance_is_over_actions_not_characters():
    # One differing action out of one: action-level distance 1; character-level would be 1/12.
    a, b = ["go to desk 1"], ["go to desk 2"]
    assert Levenshtein.distance(a[0], b[0]) == 1  # characters
    assert prefix_edit_distance([a, b], 1) == 1.0
    # x, y differ by one character in each action, x, z by one whole action: at the character
    # level x-y would look closer than x-z; at the action level they are 2/2 and 1/2.
    x = ["go to desk 1", "open drawer 1"]
    y = ["go to desk 2", "open drawer 2"]
    z = ["go to desk 1", "inventory"]
    assert prefix_edit_distance([x, y], 2) == 1.0
    assert prefix_edit_distance([x, z], 2) == 0.5
    # The Levenshtein package compares lists of actions element by element (by hash).
    assert Levenshtein.distance(x, z) == 1
    assert Levenshtein.distance(x, y) == 2
    assert Levenshtein.distance(tuple(x), ("go to desk 1", "open drawer 1", END)) == 1


def test_finished_differs_from_still_acting():
    # [a] ended before K=2 (padded a·END) vs [a, b] still acting: one edit of 2.
    s = compute_signals([["a"], ["a", "b"]], 2)
    assert s.prefix_edit_distance_mean == pytest.approx(0.5)
    assert s.termination_fraction == pytest.approx(0.5)
    # Ended at exactly step K counts as not ended before K (tau counts len < K).
    assert compute_signals([["a", "b"], ["a", "b"]], 2).termination_fraction == 0.0


def test_k_one_has_no_bigrams():
    s = compute_signals([["a"], ["b"], ["a"]], 1)
    assert s.action_bigram_jaccard_mean == 0.0  # two empty bigram sets: distance 0
    assert s.prefix_edit_distance_mean == pytest.approx(2 / 3)


def test_observations_absent_give_nan():
    assert math.isnan(compute_signals([["a"], ["b"]], 1).obs_unique_ratio)


def test_field_names_match_schema():
    from srollout.schemas import SIGNAL_NAMES

    s = compute_signals([["a"], ["b"]], 1)
    assert tuple(s.as_dict()) == SIGNAL_NAMES
    assert tuple(AGREEMENT_SIGNALS) == SIGNAL_NAMES  # one function per name of the contract
    assert GroupSignals(*range(7)).unique_prefix_ratio == 2  # positional: the contract's order


@pytest.mark.parametrize(
    "actions, K, kwargs, match",
    [
        ([["a"]], 1, {}, "G >= 2"),
        ([], 1, {}, "G >= 2"),
        ([["a"], ["b"]], 0, {}, "K must be >= 1"),
        ([["a"], ["b"]], True, {}, "integer"),
        ([["a"], ["b"]], 1.5, {}, "integer"),
        ("ab", 1, {}, "one string"),
        (["go", ["b"]], 1, {}, r"actions\[0\] is a string"),
        ([["a"], ["b"]], 2, {"done": [True, False]}, "not done"),
        ([["a"], ["b"]], 1, {"done": [True]}, "done has 1 flags"),
        ([["a", "b"], ["b", "c"]], 2, {"observations": [["o"], ["o", "p"]]}, r"observations\[0\]"),
        ([["a"], ["b"]], 1, {"observations": [["o"]]}, "one list per trajectory"),
        ([["a"], ["b"]], 1, {"observations": [["o"], None]}, r"observations\[1\] .* got NoneType"),
        ([["a"], ["b"]], 1, {"observations": [["o"], "p"]}, "got a string"),
    ],
)
def test_bad_input_raises_one_line(actions, K, kwargs, match):
    with pytest.raises(SrolloutError, match=match) as err:
        compute_signals(actions, K, **kwargs)
    assert "\n" not in str(err.value)


def test_done_flags_that_agree_are_accepted():
    s = compute_signals([["a"], ["a", "b"]], 2, done=[True, False])
    assert s.termination_fraction == 0.5


def test_all_distinct_actions_give_full_divergence():
    # 100 trajectories that share no action: every pair differs in all K steps and bigrams.
    acts = [[f"act {i}-{t}" for t in range(10)] for i in range(100)]
    s = compute_signals(acts, 10)
    assert s.prefix_edit_distance_mean == 1.0
    assert s.action_bigram_jaccard_mean == pytest.approx(1.0)
    assert s.unique_prefix_ratio == s.unique_action_ratio == 1.0
    assert s.action_entropy == pytest.approx(1.0)


# --------------------------------------------------------------------------------------------
# Fast paths vs the naive reference, and properties.

VOCAB = ["go to desk 1", "go to desk 2", "open drawer 1", "look", "inventory", "take pen 1"]
traj = st.lists(st.sampled_from(VOCAB), min_size=0, max_size=8)
groups = st.lists(traj, min_size=2, max_size=24)


@settings(max_examples=150, deadline=None)
@given(groups, st.integers(1, 8))
def test_matches_naive_reference(actions, K):
    obs = [[f"obs {x} {t}" for t, x in enumerate(a)] for a in actions]
    _assert_close(compute_signals(actions, K, obs), naive_signals(actions, K, obs))


def test_vectorised_paths_match_naive_on_large_groups():
    # G = 64 with many distinct prefixes takes the cdist and numpy-Jaccard paths.
    import random

    rng = random.Random(7)
    for G in (16, 40, 64):
        actions = [[rng.choice(VOCAB) for _ in range(rng.randint(3, 12))] for _ in range(G)]
        actions += [list(actions[0])] * 3  # some shared prefixes: weighted counts
        assert len(S._prefix_counts(actions, 10)) >= S._NUMPY_JACCARD_FROM
        _assert_close(compute_signals(actions, 10), naive_signals(actions, 10))


@settings(max_examples=100, deadline=None)
@given(groups, st.integers(1, 8), st.randoms(use_true_random=False))
def test_signals_in_unit_interval_and_permutation_symmetric(actions, K, rnd):
    s = compute_signals(actions, K)
    for name, v in s.as_dict().items():
        if name != "obs_unique_ratio":
            assert 0.0 <= v <= 1.0, name
    perm = list(actions)
    rnd.shuffle(perm)
    _assert_close(compute_signals(perm, K), s)


@settings(max_examples=50, deadline=None)
@given(traj, st.integers(2, 16), st.integers(1, 8), st.lists(traj, min_size=16, max_size=16))
def test_identical_prefixes_property(prefix, G, K, tails):
    actions = [list(prefix[:K]) + (tails[i] if len(prefix) >= K else []) for i in range(G)]
    s = compute_signals(actions, K)
    assert s.prefix_edit_distance_mean == 0.0
    assert s.action_bigram_jaccard_mean == 0.0
    assert s.unique_prefix_ratio == pytest.approx(1 / G)


def test_core_imports_no_torch():
    code = (
        "import sys, srollout.core, srollout.core.signals, srollout.core.gate, srollout.core.grpo, "
        "srollout.core.stats, srollout.core.sweep; "
        "bad = [m for m in ('torch', 'transformers', 'polars', 'alfworld') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_each_registered_signal_is_one_function_of_the_group_at_K():
    # G = 4 at K = 2: prefixes (a,b) (a,b) (a,c) (END,END): the last ended after 0 actions.
    g = group_at_K([["a", "b"], ["a", "b", "x"], ["a", "c"], []], 2, done=[True, False, True, True])
    assert (g.distinct, g.weights, g.a_K) == (
        [("a", "b"), ("a", "c"), (END, END)],
        [2, 1, 1],
        ["b", "b", "c", END],
    )
    by_name = {name: fn(g) for name, fn in AGREEMENT_SIGNALS.items()}
    # pairs: 1 at distance 0, 2 at 1 ((a,b)-(a,c)), 3 at 2 (anything - (END,END)): 8 / (2 * 6)
    assert by_name["prefix_edit_distance_mean"] == pytest.approx(8 / 12)
    # bigram sets {ab} {ab} {ac} {EE}: one pair with Jaccard distance 0, five with 1
    assert by_name["action_bigram_jaccard_mean"] == pytest.approx(5 / 6)
    assert by_name["unique_prefix_ratio"] == 3 / 4
    assert by_name["unique_action_ratio"] == 3 / 4
    # a_K = b b c END: -(1/2 ln 1/2 + 2 * 1/4 ln 1/4) / ln 4 = 1.5 ln 2 / 2 ln 2
    assert by_name["action_entropy"] == pytest.approx(0.75)
    assert math.isnan(by_name["obs_unique_ratio"])
    assert by_name["termination_fraction"] == 1 / 4
    assert compute_signals(
        [["a", "b"], ["a", "b", "x"], ["a", "c"], []], 2
    ).as_dict() == pytest.approx(by_name, nan_ok=True)


def test_group_signals_by_name_immutable_and_pickled_by_value():
    import pickle

    values = dict(zip(AGREEMENT_SIGNALS, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], strict=True))
    s = GroupSignals(**values, steps=(("invalid_action_rate", 0.25),))
    assert s == GroupSignals(*values.values(), steps=(("invalid_action_rate", 0.25),))
    assert s.action_entropy == 0.5 and s.as_dict()["invalid_action_rate"] == 0.25
    assert pickle.loads(pickle.dumps(s)) == s
    assert s.with_steps(()).as_dict() == values
    with pytest.raises(AttributeError, match="immutable"):
        s.action_entropy = 0.0
    with pytest.raises(AttributeError, match="no signal 'd_K'"):
        _ = s.d_K
    with pytest.raises(SrolloutError, match="missing: termination_fraction"):
        GroupSignals(*list(values.values())[:6])
    with pytest.raises(SrolloutError, match="twice: prefix_edit_distance_mean"):
        GroupSignals(0.1, **values)
    with pytest.raises(SrolloutError, match="unknown: d_K"):
        GroupSignals(**values, d_K=0.1)
