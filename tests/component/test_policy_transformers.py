"""The transformers backend on a tiny real Qwen2 (built in a few seconds): KV reuse equals
re-encoding, seeds reproduce, tokens and masks round-trip, LoRA adapters load and matter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from srollout.errors import SrolloutError  # noqa: E402
from srollout.policy.base import ActRequest, TrajKey  # noqa: E402
from srollout.policy.chat import Turn, tokenize_chat  # noqa: E402

SYSTEM = "You are an agent in a household. Answer with Thought: ... then Action: <action>."
OBS = [
    "You are in the middle of a room. Your task is to: put apple in fridge 1.",
    "You arrive at cabinet 1. On it, you see a apple 1.",
    "Nothing happens.",
    "You arrive at fridge 1. On it, you see a mug 2.",
    "You are in the middle of a room. Your task is to: put egg in sinkbasin 1.",
]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from tiny_policy import build_tiny_policy

    torch.set_num_threads(1)
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def _policy(path, **kw):
    from srollout.policy.transformers_backend import TransformersPolicy

    kw.setdefault("max_new_tokens", 24)
    return TransformersPolicy(path, **kw)


def _rollout(policy, keys, n_steps=4, start=None, seed0=100):
    """Drive ``policy`` like the engine: every live key acts once per tick; key k starts at tick
    start[k] (so rows at different steps share a batch). Returns texts and finished tokens."""
    start = start or {k: 1 for k in keys}
    texts = {k: [] for k in keys}
    users = {k: [] for k in keys}
    for tick in range(1, n_steps + max(start.values())):
        reqs = []
        for k in keys:
            step = tick - start[k] + 1
            if 1 <= step <= n_steps:
                user = OBS[(k.traj_idx + step) % len(OBS)]
                users[k].append(user)
                reqs.append(
                    ActRequest(key=k, step=step, seed=seed0 + k.traj_idx, system=SYSTEM, user=user)
                )
        if reqs:
            for r, a in zip(reqs, policy.act(reqs), strict=False):
                texts[r.key].append(a.text)
    tokens = {k: policy.finish(k) for k in keys}
    return texts, tokens, users


KEYS = [TrajKey("g0", i) for i in range(5)]
STAGGER = {k: 1 + (k.traj_idx % 3) for k in KEYS}


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_kv_cache_matches_reencode(tiny_model, temperature):
    kv_texts, kv_tok, _ = _rollout(
        _policy(tiny_model, temperature=temperature), KEYS, start=STAGGER
    )
    re_texts, re_tok, _ = _rollout(
        _policy(tiny_model, temperature=temperature, kv_reuse=False), KEYS, start=STAGGER
    )
    assert kv_texts == re_texts
    for k in KEYS:
        assert kv_tok[k].token_ids == re_tok[k].token_ids
        assert kv_tok[k].action_mask == re_tok[k].action_mask


def test_same_seed_same_output_and_seed_matters(tiny_model):
    a, ta, _ = _rollout(_policy(tiny_model, temperature=1.0), KEYS)
    b, tb, _ = _rollout(_policy(tiny_model, temperature=1.0), KEYS)
    c, _, _ = _rollout(_policy(tiny_model, temperature=1.0), KEYS, seed0=999)
    assert a == b and all(ta[k].token_ids == tb[k].token_ids for k in KEYS)
    assert a != c


def test_trajectory_does_not_depend_on_batch_mates(tiny_model):
    together, _, _ = _rollout(_policy(tiny_model, temperature=1.0), KEYS, start=STAGGER)
    alone, _, _ = _rollout(_policy(tiny_model, temperature=1.0), [KEYS[2]], start={KEYS[2]: 1})
    assert alone[KEYS[2]] == together[KEYS[2]]


def _ragged_calls(policy, keys, n_steps=3):
    """Every key acts at steps 1..n_steps together; returns {key: [(text, n_gen_tokens)]} and the
    per-call lists of response lengths."""
    out, lengths = {k: [] for k in keys}, []
    for step in range(1, n_steps + 1):
        reqs = [
            ActRequest(
                key=k,
                step=step,
                seed=100 + k.traj_idx,
                system=SYSTEM,
                user=OBS[(k.traj_idx + step) % len(OBS)],
            )
            for k in keys
        ]
        resp = policy.act(reqs)
        lengths.append([r.n_gen_tokens for r in resp])
        for r, a in zip(reqs, resp, strict=True):
            out[r.key].append((a.text, a.n_gen_tokens))
    return out, lengths


def test_finished_rows_leave_the_decode_batch(tiny_model):
    # max_new_tokens 40 at T=1: the tiny model ends its responses at different lengths, so rows
    # leave the batch at different decode steps (and the last live row moves into their slot).
    policy = _policy(tiny_model, temperature=1.0, max_new_tokens=40)
    together, lengths = _ragged_calls(policy, KEYS)
    assert all(len(set(call)) > 1 for call in lengths), lengths  # really ragged
    assert any(max(call) < 40 for call in lengths)  # rows ended by their end-of-turn token
    # one row-forward per generated token: no row is decoded after its response ended
    # (before, every row was decoded until the longest one ended: 5 x max per call)
    assert policy.decode_rows == sum(map(sum, lengths))
    assert policy.decode_rows < sum(len(call) * max(call) for call in lengths)
    # and each trajectory is what it is alone: leaving the batch moves rows, not their content
    for k in KEYS:
        alone, _ = _ragged_calls(_policy(tiny_model, temperature=1.0, max_new_tokens=40), [k])
        assert alone[k] == together[k], k
    for k in KEYS:
        tokens = policy.finish(k)
        assert sum(tokens.action_mask) == sum(n for _, n in together[k])


def test_the_head_runs_on_each_rows_last_position_only(tiny_model):
    # a call's first forward feeds whole observations, yet the vocabulary head sees at most one
    # position a row ([rows, <= rows, H]: logits_to_keep), and every later one a single position
    policy = _policy(tiny_model, temperature=1.0)
    seen = []
    head = policy.model.get_output_embeddings()
    handle = head.register_forward_hook(lambda _m, inp, _o: seen.append(tuple(inp[0].shape[:2])))
    try:
        _ragged_calls(policy, KEYS, n_steps=2)
    finally:
        handle.remove()
    assert seen and all(positions <= rows for rows, positions in seen), seen
    assert max(positions for _, positions in seen) > 1  # rows' feeds ended at different columns


def test_rows_are_batched_by_context_length(tiny_model):
    # STAGGER puts rows at steps 1-3 in one call: with bucket_ratio 0.9 the long-context rows
    # and the fresh ones go to separate batches; the trajectories are the same either way
    bucketed = _policy(tiny_model, temperature=1.0, bucket_ratio=0.9)
    calls = []
    generate = bucketed._generate
    bucketed._generate = lambda keys, feeds: (calls.append(len(keys)), generate(keys, feeds))[1]
    texts, tokens, _ = _rollout(bucketed, KEYS, start=STAGGER)
    one_batch, one_tokens, _ = _rollout(
        _policy(tiny_model, temperature=1.0, bucket_ratio=0.0), KEYS, start=STAGGER
    )
    assert texts == one_batch
    assert all(tokens[k].token_ids == one_tokens[k].token_ids for k in KEYS)
    ticks = len(range(1, 4 + max(STAGGER.values())))
    assert len(calls) > ticks and sum(calls) == 4 * len(KEYS)  # some tick was split, no row twice
    with pytest.raises(SrolloutError, match="bucket_ratio"):
        _policy(tiny_model, bucket_ratio=1.5)


def test_tokens_and_mask_round_trip(tiny_model):
    policy = _policy(tiny_model, temperature=0.7, max_new_tokens=40)
    texts, tokens, users = _rollout(policy, KEYS[:3])
    tok = policy.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    compared = 0
    for k in KEYS[:3]:
        ids, mask = tokens[k].token_ids, tokens[k].action_mask
        assert len(ids) == len(mask)
        runs, cur = [], []
        for i, m in enumerate(mask + [False]):
            if m:
                cur.append(ids[i])
            elif cur:
                runs.append(cur)
                cur = []
        # one run of generated tokens per step; decoding a run gives that step's response
        assert len(runs) == len(texts[k]) == 4
        for run, text in zip(runs, texts[k], strict=False):
            assert tok.decode(run, skip_special_tokens=True) == text
        # observation tokens are never action tokens: the injected part holds every user turn
        injected = tok.decode([t for t, m in zip(ids, mask, strict=False) if not m])
        for u in users[k]:
            assert u in injected
        assert (
            tok.decode(
                [t for t, m in zip(ids, mask, strict=False) if m], skip_special_tokens=True
            ).count(users[k][0])
            == 0
        )
        if all(r[-1] == im_end for r in runs):
            # what the policy recorded is exactly what SFT tokenization of the same chat gives
            chat = tokenize_chat(
                tok, SYSTEM, [Turn(u, t) for u, t in zip(users[k], texts[k], strict=False)], im_end
            )
            assert chat.token_ids == ids and chat.action_mask == mask
            compared += 1
    assert compared >= 1  # the SFT-vs-inference comparison really ran


def test_finish_frees_state_and_unknown_key_is_none(tiny_model):
    policy = _policy(tiny_model, temperature=0.0)
    policy.act([ActRequest(key=KEYS[0], step=1, seed=1, system=SYSTEM, user=OBS[0])])
    assert policy.live == 1
    assert policy.finish(KEYS[0]) is not None
    assert policy.live == 0
    assert policy.finish(KEYS[0]) is None


def test_conversation_past_the_context_is_a_user_error(tiny_model):
    # the tiny model's context is 2048 tokens; shrink it so step 2 no longer fits
    policy = _policy(tiny_model, temperature=0.0, max_new_tokens=8)
    assert policy.max_context == 2048
    first = policy.act([ActRequest(key=KEYS[0], step=1, seed=1, system=SYSTEM, user=OBS[0])])[0]
    used = len(policy._states[KEYS[0]].token_ids)
    assert used > first.n_gen_tokens > 0
    policy.max_context = used + 12
    with pytest.raises(SrolloutError, match=r"g0/0 at step 2: .* exceed the model's context of"):
        policy.act([ActRequest(key=KEYS[0], step=2, seed=1, system=SYSTEM, user=OBS[1])])


def test_fits_says_beforehand_what_act_would_refuse_and_changes_nothing(tiny_model):
    step1 = ActRequest(key=KEYS[0], step=1, seed=1, system=SYSTEM, user=OBS[0])
    step2 = ActRequest(key=KEYS[0], step=2, seed=1, system=SYSTEM, user=OBS[1])
    # a reference run measures what step 2 injects (the close of response 1, then user turn 2)
    ref = _policy(tiny_model, temperature=0.0, max_new_tokens=8)
    ref.act([step1])
    injected_before = ref._states[KEYS[0]].action_mask.count(False)
    ref.act([step2])
    n_new = ref._states[KEYS[0]].action_mask.count(False) - injected_before
    assert n_new > 0
    for room, ok in ((8, True), (7, False)):  # 8 = max_new_tokens: a full response just fits
        policy = _policy(tiny_model, temperature=0.0, max_new_tokens=8)
        policy.act([step1])
        used = len(policy._states[KEYS[0]].token_ids)
        policy.max_context = used + n_new + room
        assert policy.fits(step2) is ok
        assert len(policy._states[KEYS[0]].token_ids) == used  # asking changed nothing
        if ok:
            policy.act([step2])
        else:
            with pytest.raises(SrolloutError, match="exceed the model's context"):
                policy.act([step2])
    # a trajectory not started yet: its first turn (system + user) against the whole context
    fresh = _policy(tiny_model, temperature=0.0, max_new_tokens=8)
    fresh.max_context = injected_before + 8
    assert fresh.fits(step1) and fresh.live == 0
    fresh.max_context -= 1
    assert not fresh.fits(step1)
    # and acting on it says the first observation is too long (fewer steps cannot help)
    with pytest.raises(SrolloutError, match="first observation is too long") as err:
        fresh.act([step1])
    assert "--T-max" not in str(err.value)


def test_lora_adapter_loads_and_changes_outputs(tiny_model, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    torch.manual_seed(0)
    # init_lora_weights=False: B is random too, so the adapter is not a no-op
    cfg = LoraConfig(
        r=4, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    get_peft_model(base, cfg).save_pretrained(tmp_path / "adapter")
    plain, _, _ = _rollout(_policy(tiny_model, temperature=0.0), KEYS[:2])
    adapted_policy = _policy(tiny_model, temperature=0.0, adapter_path=tmp_path / "adapter")
    adapted, _, _ = _rollout(adapted_policy, KEYS[:2])
    assert "+adapter" in adapted_policy.name
    assert plain != adapted


def test_bad_paths_are_user_errors(tmp_path):
    from srollout.policy import make_policy

    with pytest.raises(SrolloutError, match="no config.json"):
        _policy(tmp_path)
    with pytest.raises(SrolloutError, match="no such directory"):
        make_policy("lm", model=tmp_path / "missing")
    with pytest.raises(SrolloutError, match="--policy"):
        make_policy("gpt", model=tmp_path)
    with pytest.raises(SrolloutError, match="--backend"):
        make_policy("lm", model=tmp_path, backend="tgi")


def test_saved_directory_is_a_normal_hf_model(tiny_model):
    import json

    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ):
        assert (tiny_model / name).is_file(), name
    tcfg = json.loads((tiny_model / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tcfg["chat_template"]
    assert json.loads((tiny_model / "config.json").read_text())["architectures"] == [
        "Qwen2ForCausalLM"
    ]


def test_in_place_weight_update_refreshes_the_shared_system_cache(tiny_model):
    # a trainer that updates the shared model in place must not get stale system-prompt KV
    policy = _policy(tiny_model, temperature=0.0)
    reference = _policy(tiny_model, temperature=0.0)
    before, _, _ = _rollout(policy, KEYS[:2], n_steps=2)
    with torch.no_grad():
        for p in list(policy.model.parameters())[:4]:
            p.mul_(1.5)  # in place, like optimizer.step()
            p.add_(0.05)
        for p_ref, p in zip(reference.model.parameters(), policy.model.parameters(), strict=False):
            p_ref.copy_(p)
    after, _, _ = _rollout(policy, KEYS[:2], n_steps=2)
    fresh, _, _ = _rollout(reference, KEYS[:2], n_steps=2)
    assert after == fresh
    assert after != before


def test_a_forced_turn_continues_the_conversation_as_if_generated(tiny_model):
    # steps 1 and 3 are played by another policy (force), steps 2 and 4 by the model: the
    # record equals the SFT tokenization of the whole chat, and the model's own turns equal
    # those of a re-encoding policy that sees the same conversation
    im_end = None
    key, seed = TrajKey("g9", 0), 7
    forced = {
        1: "Thought: I look.\nAction: go to cabinet 1",
        3: "Action: take apple 1 from cabinet 1",
    }
    runs = {}
    for kv in (True, False):
        # greedy with room to finish: the model's turns end with <|im_end|>, as SFT tokenizes them
        policy = _policy(tiny_model, temperature=0.0, kv_reuse=kv, max_new_tokens=60)
        im_end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
        texts = []
        for step in range(1, 5):
            req = ActRequest(key=key, step=step, seed=seed, system=SYSTEM, user=OBS[step - 1])
            if step in forced:
                policy.force(req, forced[step])
                texts.append(forced[step])
            else:
                texts.append(policy.act([req])[0].text)
        runs[kv] = (texts, policy.finish(key), policy)
    (texts, rec, policy), (re_texts, re_rec, _) = runs[True], runs[False]
    assert texts == re_texts
    chat = tokenize_chat(
        policy.tokenizer, SYSTEM, [Turn(u, t) for u, t in zip(OBS[:4], texts, strict=False)], im_end
    )
    assert rec.token_ids == chat.token_ids == re_rec.token_ids
    assert rec.action_mask == chat.action_mask
    assert policy.tokenizer.decode(rec.token_ids).count("take apple 1 from cabinet 1") == 1


@pytest.mark.parametrize("temperature", [0.0, 1.3])
def test_each_response_carries_its_tokens_raw_logprobs_as_a_full_forward_pass_gives_them(
    tiny_model, temperature
):
    """logprob_mean / logprob_min of every response (KV cache kept across turns, rows of
    different steps in one batch) equal the mean / minimum of log_softmax(logits)[token] over the
    response's tokens in one teacher-forced forward pass of the whole trajectory: raw, so the
    sampling temperature changes which tokens are drawn but not how they are scored."""
    policy = _policy(tiny_model, temperature=temperature)
    keys = [TrajKey("g", i) for i in range(3)]
    got = {k: [] for k in keys}
    for tick in range(1, 5):
        reqs = [ActRequest(key=k, step=tick - k.traj_idx % 2, seed=7 + k.traj_idx, system=SYSTEM,
                           user=OBS[(k.traj_idx + tick) % len(OBS)])
                for k in keys if tick - k.traj_idx % 2 >= 1]  # fmt: skip
        for r, a in zip(reqs, policy.act(reqs), strict=True):
            got[r.key].append((a.logprob_mean, a.logprob_min, a.n_gen_tokens))
    for k in keys:
        tokens = policy.finish(k)
        ids = torch.tensor([tokens.token_ids])
        with torch.inference_mode():
            logits = policy.model(input_ids=ids).logits[0].float()
        raw = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        mask = torch.tensor(tokens.action_mask[1:])
        # each response is one run of action tokens; cut the scored tokens into those runs
        runs, start = [], None
        for i, m in enumerate(tokens.action_mask + [False]):
            if m and start is None:
                start = i
            if not m and start is not None:
                runs.append((start, i))
                start = None
        assert [n for _, _, n in got[k]] == [b - a for a, b in runs] and mask.sum() > 0
        for (mean, low, _), (a, b) in zip(got[k], runs, strict=True):
            want = raw[a - 1 : b - 1]
            assert mean == pytest.approx(float(want.mean()), abs=1e-4)
            assert low == pytest.approx(float(want.min()), abs=1e-4)
            assert low <= mean <= 0


def test_logprob_summary_worked_by_hand():
    from srollout.policy.base import ActResponse, logprob_summary

    assert logprob_summary([-0.5, -1.5, -0.1]) == pytest.approx((-0.7, -1.5))
    nan_mean, nan_min = logprob_summary([])
    assert nan_mean != nan_mean and nan_min != nan_min
    planner = ActResponse("Action: look")  # a policy without log-probabilities
    assert planner.logprob_mean != planner.logprob_mean
