"""vLLM's offline API on kvlab's engine: ``LLM(...).generate(prompts, SamplingParams(...))``.

    from kvlab import LLM, SamplingParams

    llm = LLM("smollm2-135m", max_num_seqs=32, block_size=16)
    outputs = llm.generate(["What is the capital of France?"], SamplingParams(temperature=0))
    print(outputs[0].outputs[0].text, outputs[0].metrics.ttft)

Every knob of the labs is a constructor argument with vLLM's name, checked when the
``LLM`` is made. KV memory is sized like vLLM does it: from ``num_blocks`` if given, else
from a byte budget (``kv_cache_memory_bytes``; on CUDA by default ``gpu_memory_utilization``
of the device minus what the weights already hold; on a CPU by default 1 GiB), never more
than ``max_num_seqs`` sequences of ``max_model_len`` tokens could use
(``kvlab.engine.kv_cache_setup``).

Not handled: chat templates inside ``generate`` (use ``kvlab.chat_prompt``), LoRA,
multi-modal inputs, tensor parallelism, online serving.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
from tqdm.auto import tqdm

from kvlab.cache.block_pool import BlockPoolInterface
from kvlab.engine.kv_cache_setup import (
    check_cache_settings,
    default_kv_budget,
    make_cache,
    num_blocks_for,
)
from kvlab.engine.llm_engine import LLMEngine
from kvlab.engine.outputs import RequestOutput
from kvlab.engine.sampling_params import SamplingParams
from kvlab.engine.scheduler import Scheduler
from kvlab.engine.scheduler_config import SchedulerConfig
from kvlab.engine.step_stats import StepStats
from kvlab.model.custom_ops import CustomOpsRunner
from kvlab.model.loading import load_model
from kvlab.model.runner import ModelRunner


class LLM:
    """A model with its KV cache and scheduler, for offline batch generation.

    Args:
        model: ``"smollm2-135m"``, ``"tiny"``, ``"tiny-qwen2"``, a local checkpoint folder,
            or an already loaded transformers model (then pass ``tokenizer`` too, if any).
        tokenizer: only with a loaded model.
        kv_cache: ``"paged"`` (blocks from a shared pool) or ``"contiguous"`` (one reserved
            range per request).
        block_size: tokens per KV block (paged), 1 to 256.
        num_blocks: KV blocks in the pool (paged; contiguous gets the same token slots);
            None sizes it from the memory budget.
        kv_cache_memory_bytes: the KV memory budget in bytes (when ``num_blocks`` is None).
        gpu_memory_utilization: on CUDA without a byte budget, the share of the device's
            memory kvlab may fill, weights included, in (0, 1].
        max_num_seqs: sequences running at once (the seed article's max_batch_size).
        max_num_batched_tokens: tokens computed per step (continuous scheduling).
        max_model_len: longest prompt + output; defaults to the model's context.
        scheduling: ``"continuous"``, ``"static"`` or ``"dynamic"``.
        batch_timeout: dynamic scheduling: seconds to wait for a batch to fill.
        scheduling_policy: waiting-queue order: ``"fcfs"`` or ``"priority"``.
        enable_prefix_caching: reuse the KV blocks of equal prompt prefixes (paged).
        block_pool: a pool of blocks of one's own (paged), called with ``num_blocks``:
            a class or function returning what ``BlockPoolInterface`` declares, in place
            of kvlab's ``BlockPool`` (lab 06's build-it serves requests from the learner's).
        preemption_mode: when KV blocks run out: ``"recompute"`` or ``"swap"`` (paged).
        swap_space_bytes: CPU memory for swapped blocks; defaults to the KV pool's size.
        prefetch: swap only: copy a swapped request back a step before it resumes, while
            the step before computes (False: the resuming step waits for the copy).
        attention_backend: ``"sdpa"`` (PyTorch SDPA; the decode rows of a step batched into
            one call), ``"reference"`` (one sequence at a time), ``"triton"`` (kvlab's
            kernels) or ``"cpu"`` (kvlab's C kernel, built on first use); see
            ``kvlab.attention``.
        compile: run the model's work between attention calls compiled by torch.compile
            (``kvlab.model.compiled``; CPU only). The same tokens; not faster on a 2-core
            CPU, where it was measured.
        custom_ops: run the norms, residual adds, SiLU-and-multiply and rotary embedding
            as three C functions (``kvlab.model.custom_ops``; float32 on a CPU, built on
            first use). The same tokens; a decode step 3-5% faster at one thread here.
        watermark: admission watermark in [0, 1): the share of the KV pool that
            must stay reusable after a new request takes its blocks (see
            ``kvlab.engine.scheduler.SchedulerConfig``).
        reservation_policy: contiguous only: ``"max_model_len"``, ``"pow2"`` or ``"exact"``.
        device: where the model and KV live; None picks CUDA when present.
        dtype: weights and KV dtype (float32 keeps results equal to transformers on a CPU).
        seed: seeds sampled requests that bring no seed of their own.
        clock: ``kvlab.engine.metrics.WallClock()`` (default) or ``ManualClock(step_seconds)``.
        scheduler_class: the scheduler the engine builds: kvlab's ``Scheduler``, or your own
            (lab 04's build-it, ``kvlab.exercises.build_scheduler.StepScheduler``).
    """

    def __init__(
        self,
        model="smollm2-135m",
        *,
        tokenizer=None,
        kv_cache: str = "paged",
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float = 0.9,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 1024,
        max_model_len: int | None = None,
        scheduling: str = "continuous",
        batch_timeout: float = 0.02,
        scheduling_policy: str = "fcfs",
        enable_prefix_caching: bool = True,
        block_pool: Callable[[int], BlockPoolInterface] | None = None,
        preemption_mode: str = "recompute",
        swap_space_bytes: int | None = None,
        prefetch: bool = True,
        attention_backend: str = "sdpa",
        compile: bool = False,
        custom_ops: bool = False,
        watermark: float = 0.0,
        reservation_policy: str = "max_model_len",
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        clock=None,
        scheduler_class: type[Scheduler] = Scheduler,
    ) -> None:
        check_cache_settings(
            kv_cache=kv_cache,
            attention_backend=attention_backend,
            reservation_policy=reservation_policy,
            block_size=block_size,
            num_blocks=num_blocks,
            max_model_len=max_model_len,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            swap_space_bytes=swap_space_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching,
            block_pool=block_pool,
            preemption_mode=preemption_mode,
        )
        scheduler_config = SchedulerConfig(
            scheduling=scheduling,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            batch_timeout=batch_timeout,
            watermark=watermark,
            preemption_mode=preemption_mode,
            scheduling_policy=scheduling_policy,
            prefetch=prefetch,
        )  # checks its own fields
        self.model, self.tokenizer = _load(model, tokenizer, device, dtype)
        runner = _runner(self.model, attention_backend, compile, custom_ops)
        context = self.model.config.max_position_embeddings
        if max_model_len is not None and max_model_len > context:
            raise ValueError(
                f"max_model_len={max_model_len} is not allowed: the model's context is {context}"
            )
        max_model_len = max_model_len or context
        if num_blocks is None:
            budget = kv_cache_memory_bytes or default_kv_budget(
                runner.device, gpu_memory_utilization
            )
            num_blocks = num_blocks_for(runner, budget, block_size, max_num_seqs, max_model_len)
        cache = make_cache(
            kv_cache,
            runner,
            num_blocks,
            block_size,
            enable_prefix_caching=enable_prefix_caching,
            block_pool=block_pool,
            reservation_policy=reservation_policy,
            max_model_len=max_model_len,
        )
        num_cpu_blocks = 0
        if preemption_mode == "swap":
            block_bytes = block_size * runner.kv_spec().bytes_per_token
            num_cpu_blocks = (swap_space_bytes or num_blocks * block_bytes) // block_bytes
            if num_cpu_blocks == 0:
                raise ValueError(
                    f"swap_space_bytes={swap_space_bytes!r} holds no KV block: use at least "
                    f"{block_bytes} (one block of {block_size} tokens)"
                )
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self.engine = LLMEngine(
            runner,
            cache,
            scheduler_config,
            num_cpu_blocks=num_cpu_blocks,
            scheduler_class=scheduler_class,
            clock=clock,
            tokenizer=self.tokenizer,
            eos_token_id=eos,
            max_model_len=max_model_len,
            seed=seed,
        )
        self._request_counter = 0

    def get_tokenizer(self):
        return self.tokenizer

    @property
    def metrics(self):
        """The ``RunMetrics`` of the last ``generate`` call."""
        return self.engine.metrics

    def generate(
        self,
        prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        on_step: Callable[[StepStats], None] | None = None,
        arrival_times: Sequence[float] | None = None,
        priorities: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; return one ``RequestOutput`` per prompt, in order.

        Args:
            prompts: a string, a list of token ids, or a list of either.
            sampling_params: one for all prompts, or one per prompt; default
                ``SamplingParams()`` (vLLM's: temperature 1.0, 16 tokens).
            use_tqdm: show a progress bar (finished requests).
            on_step: called after every engine step with its ``StepStats``.
            arrival_times: seconds after now at which each request arrives (replay a
                trace); default: all at once.
            priorities: per prompt, with ``scheduling_policy="priority"`` (lower first).

        Raises:
            ValueError: a prompt or parameter is refused; no request of this call runs, and
                the engine stays usable.
        """
        prompts = _as_prompt_list(prompts)
        params = _per_prompt("sampling_params", sampling_params, len(prompts))
        params = [p if p is not None else SamplingParams() for p in params]
        arrivals = _per_prompt("arrival_times", arrival_times, len(prompts), broadcast=False)
        priority = _per_prompt("priorities", priorities, len(prompts), broadcast=False)
        engine = self.engine
        engine.reset_metrics()
        start = engine.clock.now()
        ids = []
        try:
            for i, prompt in enumerate(prompts):
                request_id = str(self._request_counter)
                self._request_counter += 1
                arrival = None if arrivals[i] is None else start + arrivals[i]
                # Only finished outputs are kept here: the engine need not build the others.
                final_only = dataclasses.replace(params[i], output_kind="final_only")
                engine.add_request(request_id, prompt, final_only, arrival, priority[i] or 0)
                ids.append(request_id)
        except ValueError as error:
            for request_id in ids:
                engine.abort_request(request_id)
            raise ValueError(f"prompt {len(ids)}: {error}") from None
        results: dict[str, RequestOutput] = {}
        previous_on_step, engine.on_step = engine.on_step, on_step
        try:
            with tqdm(total=len(ids), desc="Generating", unit="req", disable=not use_tqdm) as bar:
                while engine.has_unfinished_requests():
                    for output in engine.step():
                        if output.finished:
                            results[output.request_id] = output
                            bar.update(1)
        finally:
            engine.on_step = previous_on_step
        return [results[request_id] for request_id in ids]


def _load(model, tokenizer, device, dtype):
    """(model, tokenizer) from a name or folder, or the loaded model given."""
    if isinstance(model, str) or hasattr(model, "__fspath__"):
        return load_model(model, device=device, dtype=dtype)
    if isinstance(model, torch.nn.Module):
        return model, tokenizer
    raise ValueError(
        f"model={model!r} is not allowed: use a model name, a checkpoint folder or a "
        "loaded transformers model"
    )


def _as_prompt_list(prompts) -> list:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, torch.Tensor):
        prompts = prompts.tolist()
    if not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError(
            f"prompts={prompts!r} is not allowed: use a string, a list of token ids, or a "
            "non-empty list of either"
        )
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [list(prompts)]  # one prompt given as token ids
    return list(prompts)


def _per_prompt(name: str, value, num_prompts: int, broadcast: bool = True) -> list:
    """One value per prompt; a single ``SamplingParams`` serves every prompt."""
    if value is None:
        return [None] * num_prompts
    if broadcast and isinstance(value, SamplingParams):
        return [value] * num_prompts
    if isinstance(value, str) or not isinstance(value, Sequence):
        one = "a SamplingParams, or " if broadcast else ""
        raise ValueError(
            f"{name}={value!r} is not allowed: use {one}a list with one value per prompt"
        )
    if len(value) != num_prompts:
        raise ValueError(
            f"{name} is not allowed: give one value per prompt ({num_prompts}), got {len(value)}"
        )
    return list(value)


def _runner(model, attention_backend: str, compile: bool, custom_ops: bool) -> ModelRunner:
    """The eager runner, or the compiled or custom-ops one that ``compile`` or
    ``custom_ops`` asks for (CPU only, one at a time)."""
    for name, value in (("compile", compile), ("custom_ops", custom_ops)):
        if not isinstance(value, bool):
            raise ValueError(f"{name}={value!r} is not allowed: use True or False")
        if value and next(model.parameters()).device.type != "cpu":
            raise ValueError(
                f"{name}=True is not allowed on a GPU: it builds CPU code; use {name}=False"
            )
    if compile and custom_ops:
        raise ValueError(
            "compile=True and custom_ops=True are not allowed together: each replaces the "
            "same work between the matrix multiplies; choose one"
        )
    if compile:
        # Imported here: the compiled runner registers a torch op when imported.
        from kvlab.model.compiled import CompiledRunner

        return CompiledRunner(model, attention=attention_backend)
    if custom_ops:
        return CustomOpsRunner(model, attention=attention_backend)
    return ModelRunner(model, attention=attention_backend)
