"""srollout's verl agent loop run through verl's own AgentLoopWorker, on real ALFWorld games.

Only the inference server is scripted (as verl's CPU agent-loop tests do: a ``generate`` that
returns ``TokenOutput``); verl's worker, its agent-loop registry and hydra instantiation, its
Continuous Token builder, its padding/postprocessing into a DataProto, srollout's environment,
prompt, parser and barrier are all real. Needs verl (``pip install verl==0.9.1`` in an
environment of its own: it requires transformers<5.11); skipped where verl is not importable,
which includes CI's main environment.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import numpy as np
import pytest

verl = pytest.importorskip(
    "verl.experimental.agent_loop.agent_loop",
    reason="verl is not installed here (pip install verl==0.9.1 in a separate environment; "
    "CI's main environment has transformers>=5.19, which verl 0.9.1 refuses)",
)

from omegaconf import OmegaConf  # noqa: E402  (verl's dependency)
from transformers import AutoTokenizer  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

import srollout.integrations.verl as sv  # noqa: E402
from srollout.default_policy import SHIPPED_DIR  # noqa: E402
from srollout.envs.tasks import load_task_set  # noqa: E402
from srollout.errors import SrolloutError  # noqa: E402

G, PROMPT_LEN, RESPONSE_LEN = 4, 512, 1024


class ScriptedServer:
    """The inference server, scripted: the k-th session (request id) seen for a task plays
    ``scripts[task_text][k]``, one action per call, as ``Action: <a>`` + end of turn."""

    def __init__(self, tokenizer, scripts: dict[str, list[list[str]]]) -> None:
        self.tokenizer, self.scripts = tokenizer, scripts
        self.sessions: dict[str, tuple[list[str], list[int]]] = {}
        self.seen: dict[str, int] = {}
        self.calls = 0
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(
        self, request_id, *, prompt_ids, sampling_params, **kwargs: Any
    ) -> TokenOutput:
        self.calls += 1
        await asyncio.sleep(0.001)  # a real server answers later, in any order
        if request_id not in self.sessions:
            prompt = self.tokenizer.decode(prompt_ids)
            task = next(t for t in self.scripts if t in prompt)
            k = self.seen.get(task, 0)
            self.seen[task] = k + 1
            self.sessions[request_id] = (self.scripts[task][k], [0])
        script, pos = self.sessions[request_id]
        action = script[pos[0]]
        pos[0] += 1
        ids = self.tokenizer.encode(f"Action: {action}", add_special_tokens=False) + [self.eot]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


def make_worker(server, tokenizer, agent_loop_config: str, n: int = G) -> AgentLoopWorker:
    """verl's AgentLoopWorker without Ray, set up the way verl's own CPU tests do."""
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "n": n,
                    "prompt_length": PROMPT_LEN,
                    "response_length": RESPONSE_LEN,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": -1,
                    "calculate_log_probs": True,
                    "val_kwargs": {"top_p": 1.0, "top_k": -1, "temperature": 0, "n": 1},
                    "agent": {
                        "default_agent_loop": sv.GATED,
                        "agent_loop_config_path": agent_loop_config,
                    },
                    "multi_turn": {"tool_config_path": None},
                },
                "model": {"path": str(SHIPPED_DIR)},
            },
            "data": {"apply_chat_template_kwargs": {}},
        }
    )
    # What AgentLoopWorker.__init__ does with agent_loop_config_path: register the entries.
    for entry in OmegaConf.load(agent_loop_config):
        verl._agent_loop_registry[entry.name] = entry
    worker = object.__new__(AgentLoopWorker)
    worker.config = config
    worker.rollout_config = config.actor_rollout_ref.rollout
    worker.llm_client = server
    worker.tokenizer = tokenizer
    worker.processor = None
    worker.hf_model_type = "qwen2"  # what the shipped model's config.json says
    worker.dataset_cls = RLHFDataset
    worker.tools = []
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    worker.mm_processor_kwargs = {}
    return worker


def objects(values: list) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def batch_of(
    rows: list[dict], uids: list[str], n: int = G, global_steps: int | None = None
) -> DataProto:
    """The rollout batch verl builds: each prompt repeated n times, interleaved, with its uid
    (and, as verl's v1 trainer adds it, the trainer's step)."""
    idx = [i for i in range(len(rows)) for _ in range(n)]
    steps = {} if global_steps is None else {"global_steps": objects([global_steps] * len(idx))}
    return DataProto.from_dict(
        tensors={"dummy_tensor": np.zeros((len(idx), 1), dtype=np.uint8)},
        non_tensors={
            "raw_prompt": objects([rows[i]["prompt"] for i in idx]),
            "agent_name": np.array([rows[i]["agent_name"] for i in idx], dtype=object),
            "extra_info": objects([rows[i]["extra_info"] for i in idx]),
            "index": np.array([rows[i]["extra_info"]["index"] for i in idx], dtype=object),
            "uid": np.array([uids[i] for i in idx], dtype=object),
            **steps,
        },
    )


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(SHIPPED_DIR)


@pytest.fixture(scope="module")
def two_tasks():
    """Two games whose expert walkthroughs are 4 steps long."""
    tasks = [
        t
        for t in load_task_set("train", "small", n=12, progress=False)
        if len(t.meta["walkthrough"]) == 4
    ]
    return tasks[0], tasks[1]


def rows_for(tasks, agent_name=sv.GATED):
    return [
        {
            "prompt": [{"role": "user", "content": t.task_text}],
            "agent_name": agent_name,
            "extra_info": {"index": i, "task_id": t.task_id, sv.TASK_KEY: sv.task_to_json(t)},
        }
        for i, t in enumerate(tasks)
    ]


def scripts_for(cut_task, kept_task, K):
    """cut_task: session 0 wins (walkthrough, 4 steps < K), sessions 1-3 repeat "look".
    d_K = 3 pairs x K (walkthrough+END vs look^K) / (6 pairs x K) = 0.5 < d_L = 0.6: cut.
    kept_task: session 0 wins, sessions 1-3 send distinct invalid actions at every step:
    every pair differs at all K steps, d_K = 1.0 >= 0.6: kept."""
    win = lambda t: list(t.meta["walkthrough"])  # noqa: E731
    return {
        cut_task.task_text.rstrip("."): [win(cut_task)] + [["look"] * 12] * 3,
        kept_task.task_text.rstrip("."): [win(kept_task)]
        + [[f"examine thing {j}{t}" for t in range(12)] for j in range(1, 5)],
    }


def run_batch(worker, batch):
    return asyncio.run(worker.generate_sequences(batch))


def test_cut_and_kept_groups_through_verls_agent_loop_worker(tokenizer, two_tasks, tmp_path):
    cut_task, kept_task = two_tasks
    K, T_max = 6, 8
    settings = sv.VerlGateSettings(
        gate={"kind": "threshold", "rule": "r1", "K": K, "d_L": 0.6}, T_max=T_max, timeout_s=30
    )
    cfg = sv.write_agent_loop_config(tmp_path / "agent_loops.yaml", settings)
    server = ScriptedServer(tokenizer, scripts_for(cut_task, kept_task, K))
    worker = make_worker(server, tokenizer, str(cfg))
    out = run_batch(worker, batch_of(rows_for([cut_task, kept_task]), ["u-cut", "u-kept"]))

    nt = out.non_tensor_batch
    assert list(nt["uid"]) == ["u-cut"] * G + ["u-kept"] * G
    cut, kept = slice(0, G), slice(G, 2 * G)
    # the cut group: stopped at K, every session, the early winner included, scores 0.0
    assert list(nt["srollout_cut"][cut]) == [True] * G
    assert list(nt["srollout_cut_step"][cut]) == [K] * G
    assert sorted(nt["srollout_steps"][cut]) == [4, K, K, K]
    assert sorted(nt["srollout_ended_by"][cut]) == ["done", "gate", "gate", "gate"]
    assert sorted(nt["srollout_env_reward"][cut]) == [0.0, 0.0, 0.0, 1.0]  # logged only
    scores = out.batch["rm_scores"].sum(dim=1)
    assert scores[cut].tolist() == [0.0] * G
    # the kept group: played out (winner 4 steps, the others T_max), rewards as the env gave
    assert list(nt["srollout_cut"][kept]) == [False] * G
    assert sorted(nt["srollout_steps"][kept]) == [4, T_max, T_max, T_max]
    assert sorted(scores[kept].tolist()) == [0.0, 0.0, 0.0, 1.0]
    assert sorted(nt["score"][kept].tolist()) == [0.0, 0.0, 0.0, 1.0]  # reward_extra_info
    # verl's DAPO filter (ReplayBuffer._dapo_filtered_keys, metric=reward: rm_scores summed per
    # trajectory) evicts a finished group iff it has > 1 trajectory and np.std == 0.0
    for s in (cut, kept):
        values = [float(v) for v in scores[s]]
        evicted = len(values) > 1 and float(np.std(values)) == 0.0
        assert evicted == (s is cut)
    # generation: 4 + 3 x K for the cut group, 4 + 3 x T_max for the kept one
    assert server.calls == (4 + 3 * K) + (4 + 3 * T_max)

    # masks: one assistant turn per step (mask 1, its tokens + end of turn), the observations
    # between them (mask 0); the response is right-padded to response_length
    mask = out.batch["response_mask"]
    responses = out.batch["responses"]
    for row in range(2 * G):
        steps = int(nt["srollout_steps"][row])
        m = mask[row].tolist()
        runs = [(v, sum(1 for _ in g)) for v, g in itertools.groupby(m)]
        ones = [n for v, n in runs if v == 1]
        assert len(ones) == steps, row
        n_valid = int(out.batch["attention_mask"][row, PROMPT_LEN:].sum())
        assert all(v == 0 for v in m[n_valid:])
        text = tokenizer.decode(responses[row, :n_valid][mask[row, :n_valid] == 1].tolist())
        assert text.count("Action:") == steps
    assert "rollout_log_probs" in out.batch.keys()
    # the worker's barrier freed both groups
    assert all(b.open_groups == 0 for b in sv._BARRIERS.values())


def test_ungated_loop_plays_the_same_group_out(tokenizer, two_tasks, tmp_path):
    cut_task, kept_task = two_tasks
    settings = sv.VerlGateSettings(
        gate={"kind": "threshold", "rule": "r1", "K": 6, "d_L": 0.6}, T_max=8
    )
    cfg = sv.write_agent_loop_config(tmp_path / "agent_loops.yaml", settings)
    server = ScriptedServer(tokenizer, scripts_for(cut_task, kept_task, 6))
    worker = make_worker(server, tokenizer, str(cfg))
    out = run_batch(worker, batch_of(rows_for([cut_task], sv.UNGATED), ["u0"]))
    nt = out.non_tensor_batch
    assert list(nt["srollout_cut"]) == [False] * G
    assert sorted(nt["srollout_steps"]) == [4, 8, 8, 8]
    assert sorted(out.batch["rm_scores"].sum(dim=1).tolist()) == [0.0, 0.0, 0.0, 1.0]


def test_the_default_policys_compact_template_is_rendered_token_for_token(
    tokenizer, two_tasks, tmp_path
):
    """The response tokens equal the chat template's own rendering of the conversation (verl
    picks its Qwen builder for model_type qwen2, which would add ChatML's newline)."""
    cut_task, kept_task = two_tasks
    settings = sv.VerlGateSettings(gate={"kind": "fixed", "cut": False, "K": 2}, T_max=3)
    cfg = sv.write_agent_loop_config(tmp_path / "agent_loops.yaml", settings)
    server = ScriptedServer(tokenizer, scripts_for(cut_task, kept_task, 2))
    worker = make_worker(server, tokenizer, str(cfg))
    out = run_batch(worker, batch_of(rows_for([kept_task]), ["u0"]))
    row = [i for i in range(G) if out.non_tensor_batch["srollout_steps"][i] == 3][0]
    ids = out.batch["input_ids"][row][out.batch["attention_mask"][row] == 1].tolist()
    text = tokenizer.decode(ids)
    assert "<|im_end|>\n" not in text
    assert text.count("<|assistant|>") == 3 and text.count("<|user|>") == 3


def test_rollout_n_must_match_the_gates_G(tokenizer, two_tasks, tmp_path):
    settings = sv.VerlGateSettings(G=8, T_max=3)
    cfg = sv.write_agent_loop_config(tmp_path / "agent_loops.yaml", settings)
    worker = make_worker(ScriptedServer(tokenizer, {}), tokenizer, str(cfg), n=G)
    with pytest.raises(Exception) as err:
        run_batch(worker, batch_of(rows_for([two_tasks[0]]), ["u0"]))
    assert "set rollout.n=8" in str(err.value) or "set rollout.n=8" in str(err.value.__cause__)


def test_bad_rows_and_settings_are_clear_errors(tmp_path):
    with pytest.raises(SrolloutError, match="write_verl_dataset"):
        sv.task_from_row({"extra_info": {}})
    with pytest.raises(SrolloutError, match="unknown srollout setting 'K'"):
        sv.VerlGateSettings.resolve({"K": 3}, OmegaConf.create({}))
    cfg = sv.write_agent_loop_config(tmp_path / "a.yaml")
    with pytest.raises(SrolloutError, match="exists"):
        sv.write_agent_loop_config(cfg)


def test_write_verl_dataset_round_trips_through_rlhfdataset(tokenizer, two_tasks, tmp_path):
    path = sv.write_verl_dataset(list(two_tasks), tmp_path / "train.parquet")
    ds = RLHFDataset(
        data_files=[str(path)],
        tokenizer=tokenizer,
        config=OmegaConf.create(
            {
                "prompt_key": "prompt",
                "max_prompt_length": 512,
                "filter_overlong_prompts": False,
                "cache_dir": str(tmp_path / "cache"),
            }
        ),
    )
    assert len(ds) == 2
    row = ds[1]
    assert row["agent_name"] == sv.GATED
    assert sv.task_from_row(row) == two_tasks[1]


def run_like_v1(worker, row, uid, n):
    """The n sessions of one prompt as verl's v1 worker starts them
    (AgentLoopWorkerTQ._run_prompt: n tasks with session_id=i, created before any runs)."""
    prompt = {
        "raw_prompt": row["prompt"],
        "agent_name": row["agent_name"],
        "extra_info": row["extra_info"],
        "index": row["extra_info"]["index"],
        "uid": uid,
    }
    trajectory = {"step": 0, "sample_index": 0, "rollout_n": 0, "validate": False}

    async def main():
        tasks = [
            asyncio.create_task(worker._run_agent_loop({}, trajectory, session_id=i, **prompt))
            for i in range(n)
        ]
        return await asyncio.gather(*tasks, return_exceptions=True)

    return asyncio.run(main())


def test_v1_session_ids_meet_at_the_barrier(tokenizer, two_tasks, tmp_path):
    cut_task, kept_task = two_tasks
    settings = sv.VerlGateSettings(
        gate={"kind": "threshold", "rule": "r1", "K": 6, "d_L": 0.6}, T_max=8
    )
    cfg = sv.write_agent_loop_config(tmp_path / "agent_loops.yaml", settings)
    server = ScriptedServer(tokenizer, scripts_for(cut_task, kept_task, 6))
    worker = make_worker(server, tokenizer, str(cfg))
    outs = run_like_v1(worker, rows_for([cut_task])[0], "u-v1", G)
    assert [o.extra_fields["srollout_cut"] for o in outs] == [True] * G
    assert [o.reward_score for o in outs] == [0.0] * G


def test_a_group_larger_than_G_is_refused(tokenizer, two_tasks, tmp_path):
    cut_task, kept_task = two_tasks
    settings = sv.VerlGateSettings(
        gate={"kind": "fixed", "cut": False, "K": 2}, T_max=3, timeout_s=5
    )
    cfg = sv.write_agent_loop_config(tmp_path / "agent_loops.yaml", settings)
    server = ScriptedServer(tokenizer, scripts_for(cut_task, kept_task, 2))
    worker = make_worker(server, tokenizer, str(cfg))
    # rollout.n says 4, but this prompt asks for 5 sessions (verl's per-prompt __rollout_n__)
    outs = run_like_v1(worker, rows_for([kept_task])[0], "u-big", G + 1)
    errors = [o for o in outs if isinstance(o, BaseException)]
    assert len(errors) == 1 and "outside 0..3" in str(errors[0])
    assert all(b.open_groups == 0 for b in sv._BARRIERS.values())


def test_the_trajectory_gate_ends_stalled_sessions_in_verls_loop(tokenizer, two_tasks, tmp_path):
    """stall W 2 from step 3 on the kept task's group: session 0 plays its walkthrough (every
    observation new) and wins at step 4; sessions 1-3 send distinct invalid actions, each
    answered "Nothing happens.", seen from step 2 on: steps since a new observation 0, 1, 2, so
    each ends after step 3, stalled, with its reward so far (0). All end before K = 6: no cut.
    The ungated loop (validation) plays the same group out to T_max."""
    _, kept_task = two_tasks
    settings = sv.VerlGateSettings(
        gate={"kind": "threshold", "rule": "r1", "K": 6, "d_L": 0.6}, T_max=8, timeout_s=30,
        stall=2, stall_from=3,
    )  # fmt: skip
    cfg = sv.write_agent_loop_config(tmp_path / "agent_loops.yaml", settings)
    server = ScriptedServer(tokenizer, scripts_for(kept_task, kept_task, 6))
    worker = make_worker(server, tokenizer, str(cfg))
    out = run_batch(worker, batch_of(rows_for([kept_task]), ["u0"]))
    nt = out.non_tensor_batch
    assert sorted(nt["srollout_ended_by"]) == ["done", "stalled", "stalled", "stalled"]
    assert sorted(nt["srollout_steps"]) == [3, 3, 3, 4]
    assert list(nt["srollout_cut"]) == [False] * G
    assert sorted(out.batch["rm_scores"].sum(dim=1).tolist()) == [0.0, 0.0, 0.0, 1.0]
    assert server.calls == 4 + 3 * 3
    ungated = make_worker(ScriptedServer(tokenizer, scripts_for(kept_task, kept_task, 6)),
                          tokenizer, str(cfg))  # fmt: skip
    whole = run_batch(ungated, batch_of(rows_for([kept_task], sv.UNGATED), ["u1"]))
    assert sorted(whole.non_tensor_batch["srollout_steps"]) == [4, 8, 8, 8]
    bad = sv.VerlGateSettings(gate=None, T_max=8, stall=2, stall_from=9)
    worker = make_worker(
        server, tokenizer, str(sv.write_agent_loop_config(tmp_path / "b.yaml", bad))
    )
    with pytest.raises(Exception) as err:  # hydra wraps what the agent loop raises
        run_batch(worker, batch_of(rows_for([kept_task]), ["u2"]))
    assert "stall k0=9 is larger than T_max=8" in str(err.value)


def test_in_shadow_verls_loop_cuts_and_stops_nothing_and_says_where_it_would(
    tokenizer, two_tasks, tmp_path
):
    """The group of the first test (cut at K 6: three sessions repeat `look`) with the stall rule
    W 2 from step 3, in shadow: every session plays out as without a gate ([4, 8, 8, 8], the
    env's rewards), each reports the step the group gate would have cut at (6), and the three
    that repeat `look` the step the stall rule would have stopped them at (the first t >= 3
    whose last 2 observations were both seen before)."""
    cut_task, kept_task = two_tasks
    settings = sv.VerlGateSettings(
        gate={"kind": "threshold", "rule": "r1", "K": 6, "d_L": 0.6}, T_max=8, timeout_s=30,
        stall=2, stall_from=3, shadow=True,
    )  # fmt: skip
    cfg = sv.write_agent_loop_config(tmp_path / "agent_loops.yaml", settings)
    server = ScriptedServer(tokenizer, scripts_for(cut_task, kept_task, 6))
    out = run_batch(make_worker(server, tokenizer, str(cfg)), batch_of(rows_for([cut_task]), ["u"]))
    nt = out.non_tensor_batch
    assert list(nt["srollout_cut"]) == [False] * G
    steps = [int(s) for s in nt["srollout_steps"]]
    assert sorted(steps) == [4, 8, 8, 8]
    assert sorted(out.batch["rm_scores"].sum(dim=1).tolist()) == [0.0, 0.0, 0.0, 1.0]
    assert list(nt["srollout_shadow_cut_step"]) == [6] * G
    stops = [int(s) for s in nt["srollout_shadow_stop_step"]]
    assert sorted(stops)[0] == -1 and all(3 <= s < 8 for s in sorted(stops)[1:])
    assert stops[steps.index(4)] == -1  # the winner saw something new at every step
    assert set(nt["srollout_ended_by"]) <= {"done", "max_steps"}


def test_the_loop_writes_a_trainer_log_that_a_resumed_run_replaces_step_by_step(
    tokenizer, two_tasks, tmp_path, monkeypatch
):
    """Shadow (the group gate at K 6, the stall rule W 2 from 3) with log_dir: each session
    writes its steps and trajectory as it ends; merged, the log reads like a collect. A second
    attempt (a run resumed from the checkpoint of step 1) plays step 2 again: the merge keeps
    that attempt's step 2 and the first attempt's step 1."""
    import polars as pl

    import srollout.rollout.trainer_log as tl
    from srollout.stages.sweep_stall import load_trajectories

    cut_task, kept_task = two_tasks
    log = tmp_path / "log"
    settings = sv.VerlGateSettings(
        gate={"kind": "threshold", "rule": "r1", "K": 6, "d_L": 0.6}, T_max=8, timeout_s=30,
        stall=2, stall_from=3, shadow=True, log_dir=str(log),
    )  # fmt: skip
    cfg = sv.write_agent_loop_config(tmp_path / "agent_loops.yaml", settings)

    def play(uid: str, step: int):
        server = ScriptedServer(tokenizer, scripts_for(cut_task, kept_task, 6))
        batch = batch_of(rows_for([cut_task]), [uid], global_steps=step)
        return run_batch(make_worker(server, tokenizer, str(cfg)), batch).non_tensor_batch

    monkeypatch.setattr(tl, "_attempt", lambda: "rA")
    first = play("u1", 1)
    play("u2", 2)
    monkeypatch.setattr(tl, "_attempt", lambda: "rB")  # resumed: step 2 again, new uid
    again = play("u3", 2)
    tl.merge_log(log)
    trajs = pl.read_parquet(log / "trajectories.parquet")
    groups = pl.read_parquet(log / "groups.parquet")
    steps = pl.read_parquet(log / "steps.parquet")
    assert groups["group_id"].to_list() == ["u1", "u3"]
    assert groups["trainer_step"].to_list() == [1, 2]
    assert groups["shadow_cut_step"].to_list() == [6, 6] and not groups["cut"].any()
    assert trajs.height == 2 * G and steps.height == trajs["n_steps"].sum()
    u1 = trajs.filter(pl.col("group_id") == "u1").sort("traj_idx")
    assert u1["n_steps"].to_list() == [int(s) for s in first["srollout_steps"]]
    stops = [int(s) for s in first["srollout_shadow_stop_step"]]
    assert u1["shadow_stop_step"].to_list() == [s if s >= 1 else None for s in stops]
    assert sorted(u1["reward"].to_list()) == [0.0, 0.0, 0.0, 1.0]
    u3 = trajs.filter(pl.col("group_id") == "u3").sort("traj_idx")
    assert u3["n_steps"].to_list() == [int(s) for s in again["srollout_steps"]]
    # the signals at K 5 of each group, from the actions the sessions played
    from srollout.core.signals import compute_signals

    signals = pl.read_parquet(log / "signals.parquet")
    assert signals["K"].to_list() == [5, 5] and signals["group_id"].to_list() == ["u1", "u3"]
    acts = [s["action"].to_list() for _, s in steps.filter(pl.col("group_id") == "u1")
            .sort("traj_idx", "step").group_by("traj_idx", maintain_order=True)]  # fmt: skip
    want = compute_signals(acts, 5).prefix_edit_distance_mean
    assert signals["prefix_edit_distance_mean"][0] == pytest.approx(want)
    # the offline evaluator reads it: its stall counters are the loop's own
    arrays = load_trajectories(log)
    assert arrays.n_steps.tolist() == trajs.sort("group_id", "traj_idx")["n_steps"].to_list()
    # a log of other settings is refused in one line
    other = sv.write_agent_loop_config(
        tmp_path / "other.yaml", sv.VerlGateSettings(T_max=7, log_dir=str(log), timeout_s=30)
    )
    server = ScriptedServer(tokenizer, scripts_for(cut_task, kept_task, 6))
    with pytest.raises(SrolloutError, match="belongs to a run made with"):
        run_batch(make_worker(server, tokenizer, str(other)),
                  batch_of(rows_for([cut_task]), ["u4"], global_steps=3))  # fmt: skip
