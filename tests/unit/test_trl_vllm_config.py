"""What the gate refuses before it generates on TRL's vLLM engine (srollout/integrations/
trl_vllm.py), and the slicing that keeps a seeded prompt whole on a CPU engine with chunked
prefill. No vLLM, TRL or torch needed: configs are stand-ins with GRPOConfig's field names."""

from __future__ import annotations

import importlib.util
import math
from types import SimpleNamespace

import pytest

from srollout.errors import SrolloutError
from srollout.integrations import trl_vllm
from srollout.integrations.trl_vllm import EnginePolicy, check_trl_vllm, guard_sync
from srollout.policy.base import TrajKey


def config(**kw):
    base = dict(
        use_vllm=True,
        vllm_mode="colocate",
        vllm_tensor_parallel_size=1,
        vllm_enable_sleep_mode=False,
    )
    return SimpleNamespace(**{**base, **kw})


def test_transformers_generation_needs_nothing():
    check_trl_vllm(SimpleNamespace(use_vllm=False, vllm_mode="server"))


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"vllm_mode": "server"}, "GRPOConfig(vllm_mode='server')"),
        ({"vllm_tensor_parallel_size": 2}, "vllm_tensor_parallel_size=1"),
        ({"vllm_enable_sleep_mode": True}, "vllm_enable_sleep_mode=False"),
    ],
)
def test_a_generation_mode_the_gate_cannot_follow_is_one_line(kw, says):
    with pytest.raises(SrolloutError) as err:
        check_trl_vllm(config(**kw))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_use_vllm_without_vllm_installed_says_how_to_get_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(SrolloutError, match=r"use_vllm=True\) but vLLM is not installed: make"):
        check_trl_vllm(config())


def _policy(budget):
    p = object.__new__(EnginePolicy)
    p.step_budget = budget
    p._done = {}
    return p


def test_slices_keep_every_prompt_inside_one_scheduler_step():
    # budget 10: 4+5 fit (9), +3 would be 12 -> new slice; 3+7 = 10 fits; 2 -> new slice
    assert _policy(10).slices([4, 5, 3, 7, 2]) == [range(0, 2), range(2, 4), range(4, 5)]
    # a GPU engine (no budget): one slice of all, none for no requests
    assert _policy(None).slices([4000, 9000]) == [range(0, 2)]
    assert _policy(None).slices([]) == []


def test_a_prompt_longer_than_a_scheduler_step_is_refused():
    with pytest.raises(SrolloutError, match="a 11-token prompt is longer than the engine's 10"):
        _policy(10).slices([3, 11])


def test_logprobs_are_padded_to_the_trajectory_and_read_once():
    p = _policy(None)
    key = TrajKey("g0", 1)
    p._done[key] = [math.nan, -0.5, -1.25]
    got = p.logprobs_of(key, 5)
    assert got[1:3] == [-0.5, -1.25] and all(math.isnan(x) for x in (got[0], *got[3:]))
    assert len(got) == 5
    assert all(math.isnan(x) for x in p.logprobs_of(key, 2))  # forgotten once read


class _Generation:
    """Stands in for TRL's VLLMGeneration in server mode (no CPU reload), whose sync fails."""

    mode = "server"

    def __init__(self, err):
        self.err = err

    def sync_weights(self):
        raise self.err


def test_weights_the_engine_refuses_are_one_line(monkeypatch):
    monkeypatch.setattr("srollout.policy.vllm_backend.on_cpu", lambda: True)
    gen = _Generation(KeyError("model.layers.0.mlp.bogus.weight"))
    guard_sync(gen)
    guard_sync(gen)  # idempotent: one wrapper
    with pytest.raises(SrolloutError) as err:
        gen.sync_weights()
    msg = str(err.value)
    assert msg.startswith(
        "the vLLM engine refused the trainer's weights (KeyError: "
        "'model.layers.0.mlp.bogus.weight')"
    ), msg
    assert "\n" not in msg


def test_on_a_cpu_colocate_engine_the_sync_is_vllms_reload_but_a_users_own_sync_is_kept(
    monkeypatch,
):
    monkeypatch.setattr("srollout.policy.vllm_backend.on_cpu", lambda: True)
    calls = []
    monkeypatch.setattr(trl_vllm, "reload_sync", lambda g: calls.append(g))

    class Colocate(_Generation):
        mode = "colocate"

    gen = Colocate(RuntimeError("TRL's in-place load"))
    guard_sync(gen)
    gen.sync_weights()
    assert calls == [gen]
    mine = Colocate(None)
    mine.sync_weights = lambda: calls.append("mine")
    guard_sync(mine)
    mine.sync_weights()
    assert calls == [gen, "mine"]
