"""Serving real requests through one KV cache, the way labs 02 and 03 do, on the engine.

``serve`` hands a list of prompts to ``kvlab.engine.llm_engine.LLMEngine`` over the cache
a lab built, and steps it to the end: the one serving loop every lab uses. Each request
declares itself to the cache when the scheduler admits it (a contiguous reservation, or a
paged prefix-cache lookup that may skip part of its prefill), may arrive at a later step,
and *waits*, first come first served, while it does not fit; the requests already running
go on. A request that could never fit, even alone, is refused with the engine's reason.
Steps are counted on a ``ManualClock`` of one second per step, so a step's index is its
start time, and ``arrival_steps`` are times on that clock.

    result = serve(runner, cache, prompts, max_new_tokens=24, eos_token_id=eos,
                   arrival_steps=[0, 0, 8], on_step=Recording())
    result.outputs[i], result.start_steps[i], result.final_slots

Not handled: sampling (greedy only), a token budget (every prompt is computed whole in
the step that admits it). Preemption is the engine's: a running request that cannot grow
takes the newest one's blocks (recompute).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvlab.cache.base import ForwardBatch, KVCache, PooledKVCache
from kvlab.engine.llm_engine import LLMEngine
from kvlab.engine.metrics import ManualClock
from kvlab.engine.sampling_params import SamplingParams
from kvlab.engine.scheduler_config import SchedulerConfig
from kvlab.engine.step_stats import StepStats
from kvlab.model.runner import ModelRunner

StepCallback = Callable[[int, KVCache], None]


@dataclass(frozen=True)
class ServeResult:
    """What ``serve`` did with each request, in the order of the prompts.

    Attributes:
        outputs: the new token ids of each request; None for a refused one.
        refused: request index -> the engine's reason why it could never fit.
        arrival_steps: the step at which each request arrived.
        start_steps: the step at which each request first ran (None if refused): a
            request that did not fit when it arrived waited ``start - arrival`` steps.
        num_cached_tokens: prompt tokens each request found in the prefix cache (their
            K/V were reused, not computed).
        num_steps: engine steps run.
        num_preemptions: running requests preempted because the pool ran out.
        final_slots: ``seq_id -> slots it had written when it ended`` (prompt + outputs
            - 1: its last token is never fed back), for each request that ran.
    """

    outputs: list[list[int] | None]
    refused: dict[int, str]
    arrival_steps: list[int]
    start_steps: list[int | None]
    num_cached_tokens: list[int]
    num_steps: int
    num_preemptions: int
    final_slots: dict[int, int]


def serve(
    runner: ModelRunner,
    cache: PooledKVCache,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_token_id: int | None = None,
    arrival_steps: Sequence[int] | None = None,
    on_step: StepCallback | None = None,
) -> ServeResult:
    """Generate greedily for every request, through ``LLMEngine`` over ``cache``.

    Args:
        runner: the model.
        cache: a contiguous or paged cache (its sequences must all be free).
        prompts: token ids of each request.
        max_new_tokens: tokens each request generates at most (fewer when EOS comes); also
            the ``max_tokens`` it declares, from which a contiguous reservation is sized.
        eos_token_id: ends a request when generated; None never stops early.
        arrival_steps: the step at which each request arrives (default: all at step 0).
        on_step: called after every step as ``on_step(step, cache)``, once the requests
            that finished in it have freed their memory.
    """
    num = len(prompts)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is not allowed: use an int > 0")
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} is not allowed: use an int > 0")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    arrivals = list(arrival_steps) if arrival_steps is not None else [0] * num
    if len(arrivals) != num:
        raise ValueError(
            f"arrival_steps has {len(arrivals)} entries for {num} prompts: give one per prompt"
        )
    engine = seat_everyone(
        runner,
        cache,
        [len(p) for p in prompts],
        eos_token_id=eos_token_id,
        on_step=None if on_step is None else _step_callback(on_step, cache),
    )
    params = SamplingParams(temperature=0, max_tokens=max_new_tokens)
    refused: dict[int, str] = {}
    for i, (prompt, arrival) in enumerate(zip(prompts, arrivals, strict=True)):
        try:
            engine.add_request(str(i), list(prompt), params, arrival_time=float(arrival))
        except ValueError as error:
            refused[i] = str(error)
    seq_ids = {i: engine.seq_id_of(str(i)) for i in range(num) if i not in refused}
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[int(output.request_id)] = output
    outputs: list[list[int] | None] = [None] * num
    start_steps: list[int | None] = [None] * num
    num_cached = [0] * num
    for i, output in finished.items():
        outputs[i] = output.outputs[0].token_ids
        start_steps[i] = round(output.metrics.arrival_time + output.metrics.queue_time)
        num_cached[i] = output.metrics.num_cached_tokens
    final_slots = {seq_ids[i]: len(prompts[i]) + len(outputs[i]) - 1 for i in seq_ids if outputs[i]}
    return ServeResult(
        outputs,
        refused,
        arrivals,
        start_steps,
        num_cached,
        len(engine.metrics.steps),
        engine.metrics.num_preemptions,
        final_slots,
    )


def seat_everyone(runner, cache: PooledKVCache, prompt_lens: Sequence[int], **kwargs) -> LLMEngine:
    """An engine that gives every request a seat and computes every prompt whole in its
    first step (memory is the only limit), on a clock of one second per step.

    Args:
        kwargs: passed on to ``LLMEngine`` (``eos_token_id``, ``on_step``).
    """
    config = SchedulerConfig(
        max_num_seqs=len(prompt_lens),
        max_num_batched_tokens=sum(prompt_lens) + len(prompt_lens),
    )
    return LLMEngine(runner, cache, config, clock=ManualClock(step_seconds=1.0), **kwargs)


def _step_callback(on_step: StepCallback, cache: KVCache) -> Callable[[StepStats], None]:
    """The engine's ``on_step(stats)`` as ``on_step(step, cache)``; a step starts one clock
    second before it ends."""
    return lambda stats: on_step(round(stats.time) - 1, cache)


def greedy_step(
    runner: ModelRunner,
    cache: KVCache,
    seq_ids: list[int],
    num_computed: list[int],
    new_tokens: list[list[int]],
) -> list[int]:
    """One forward pass over tokens that already have their slots; each sequence's argmax.

    The body of a serving step with the scheduling taken out, for a lab that drives the
    cache by hand (lab 03's fork, then copy-on-write).

    Args:
        seq_ids: the sequences in this step.
        num_computed: tokens each already holds in the cache (its context).
        new_tokens: the tokens each feeds now (``allocate_slots`` already called for them).
    """
    batch = ForwardBatch.build(
        seq_ids, num_computed, [len(t) for t in new_tokens], device=runner.device
    )
    input_ids = torch.tensor([t for tokens in new_tokens for t in tokens], device=runner.device)
    return runner.forward(input_ids, batch, cache).argmax(dim=-1).tolist()
