"""Pure parts of the vLLM backends: per-step seeds, error lines, URLs, a missing vLLM."""

from __future__ import annotations

import importlib.util

import pytest

from srollout.errors import NotAvailableError, SrolloutError
from srollout.policy.vllm_backend import one_line, require_vllm, step_seed
from srollout.policy.vllm_server import ServerClient


def test_step_seed_is_a_fixed_mix_of_seed_and_step():
    # (seed * 1_000_003 + step * 7_919) mod (2^31 - 1), by hand
    assert step_seed(0, 1) == 7_919
    assert step_seed(3, 2) == 3 * 1_000_003 + 2 * 7_919 == 3_015_847
    # 5_000_022_919 = 2 * 2_147_483_647 + 705_055_625: it wraps into [0, 2^31 - 1)
    assert step_seed(5_000, 1) == 705_055_625


def test_one_line_takes_pydantics_reason_not_its_header():
    err = ValueError(
        "1 validation error for ModelConfig\n  Value error, Model "
        "architectures ['X'] are not supported [type=value_error, "
        "input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]\n    more"
    )
    assert one_line(err) == "Value error, Model architectures ['X'] are not supported"
    assert one_line(RuntimeError("\n\nfirst\nsecond")) == "first"
    assert one_line(KeyError()) in ("KeyError", "")  # an empty message still names something


def test_without_vllm_the_backend_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(NotAvailableError, match="make setup-vllm"):
        require_vllm()


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
        ("localhost:9", "http://localhost:9"),
    ],
)
def test_server_urls(url, base):
    assert ServerClient(url).base_url == base


def test_a_bad_url_is_refused():
    with pytest.raises(SrolloutError, match="expected http://HOST:PORT"):
        ServerClient("ftp://x")


def test_the_server_backend_without_a_url_is_one_check_for_preflight_and_make_policy():
    from srollout.cli.app import cli_line
    from srollout.errors import ArgumentError
    from srollout.policy import make_policy, preflight

    for call in (preflight, make_policy):
        with pytest.raises(ArgumentError, match="^backend vllm-server needs base_url$") as err:
            call("lm", "default", "vllm-server")
        assert cli_line(err.value) == "backend vllm-server needs --base-url"


def test_a_forced_turn_leaves_the_conversation_as_a_generated_one_would():
    """DAgger's expert turns go into a vLLM conversation without generating: the next prompt's
    ids are the same as if the model had generated the text, and turn_ids changes nothing."""
    from transformers import AutoTokenizer

    from srollout.default_policy import SHIPPED_DIR
    from srollout.policy.base import ActRequest, TrajKey
    from srollout.policy.chat import encode_text
    from srollout.policy.vllm_backend import TokenConversations

    tok = AutoTokenizer.from_pretrained(SHIPPED_DIR)
    key = TrajKey(0, 0)
    first = ActRequest(key, 1, 7, "SYS", "Observation: you are in a room.")
    second = ActRequest(key, 2, 7, "SYS", "Observation: Nothing happens.")
    generated, forced = TokenConversations(tok), TokenConversations(tok)
    generated.prompt(first)
    text = "Action: look"
    generated.record(first, encode_text(tok, text) + [generated.eot_ids[0]], 0)
    forced.force(first, text)
    n_held, new = forced.turn_ids(second)
    assert forced.turn_ids(second) == (n_held, new) == generated.turn_ids(second)
    ids_g, n_g = generated.prompt(second)
    ids_f, n_f = forced.prompt(second)
    assert ids_f == ids_g and n_f == n_g == len(new)
    assert len(ids_f) == n_held + len(new)
    tokens = forced.finish(key)
    assert tokens is not None and tokens.action_mask.count(True) == len(encode_text(tok, text)) + 1
