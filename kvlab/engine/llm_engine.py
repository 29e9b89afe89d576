"""The engine: a model runner, a KV cache and a scheduler, driven one step at a time.

``LLMEngine.step()`` is one iteration of the serving loop, in the seed article's order:

    1. arrivals     requests whose arrival time has passed join the waiting queue
    2. admit        the scheduler picks this step's sequences and their tokens ...
    3. allocate     ... and takes their KV slots (blocks from the shared pool, block table
                    updated; a preemption frees or swaps blocks when none are left)
       prefetch     with swapping: start copying swapped-out blocks back for the requests
                    the next step may resume, so the copy overlaps this step's compute
    4. compute      one forward pass over the new tokens of every sequence, packed flat
                    (varlen, ``pack_step``: a prefill chunk and 60 decodes share the same
                    matmuls)
    5. sample       ``num_computed_tokens`` advances by the tokens just computed; a
                    sequence whose tokens are all computed gets a next token (a prefill
                    chunk that is not its last samples nothing); a request with n > 1
                    forks its samples 1..n-1 here, sharing the prompt's blocks; a token
                    ends a sample at EOS (unless ignore_eos), max_tokens or max_model_len;
                    each token's time is kept (TTFT, the gaps between tokens)
    6. free         finished sequences give their blocks back; full blocks stay in the
                    prefix cache, reusable by a later prompt with the same prefix

and it returns a ``RequestOutput`` for every request that got a token. ``kvlab.LLM`` wraps
this loop for offline use; a lab can call ``step()`` itself and draw the cache in between.

Before a request joins, ``add_request`` checks it (the intake, at the end of this file):
its prompt ids are in the vocabulary, the prompt leaves room for an output token in
``max_model_len``, the request could run alone in the KV pool, and its arrival time and
priority are numbers.

Not handled: online serving (HTTP, streaming), tensor parallelism, detokenizing text
before a sample finishes, stop strings, beam search, logprobs, multi-modal prompts.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence

import torch

from kvlab.cache.base import ForwardBatch, PooledKVCache
from kvlab.cache.manager import CacheFullError, KVCacheManager
from kvlab.cache.swap import SwapSpace
from kvlab.engine.metrics import RunMetrics, WallClock
from kvlab.engine.outputs import RequestOutput, request_output
from kvlab.engine.request import Request, RequestStatus
from kvlab.engine.sampler import make_generator, sample
from kvlab.engine.sampling_params import SamplingParams
from kvlab.engine.scheduler import Scheduler, SchedulerOutput
from kvlab.engine.scheduler_config import SchedulerConfig
from kvlab.engine.step_cost import StepWork
from kvlab.engine.step_stats import StepStats
from kvlab.model.runner import ModelRunner

StepCallback = Callable[[StepStats], None]


class LLMEngine:
    """Owns the runner, the cache and the scheduler; ``step()`` advances every request.

    Args:
        runner: the model (``kvlab.model.runner.ModelRunner``).
        cache: a ``PagedKVCache`` or ``ContiguousKVCache`` shaped like the model.
        scheduler_config: batching policy and limits.
        num_cpu_blocks: blocks of CPU memory to swap to, >= 1 when ``preemption_mode="swap"``.
        scheduler_class: the scheduler to build, called as ``(scheduler_config, kv,
            num_cpu_blocks)``: kvlab's ``Scheduler``, or a learner's (lab 04's build-it).
        clock: ``WallClock()`` (default) or ``ManualClock(step_seconds)`` for replays.
        tokenizer: decodes finished samples and encodes text prompts; None for token ids only.
        eos_token_id: ends a sample unless ``ignore_eos``; None never stops on EOS.
        max_model_len: longest sequence; defaults to the model's ``max_position_embeddings``.
        seed: seeds the per-request seeds of sampled requests that bring none.
        on_step: called with each step's ``StepStats`` (e.g. to redraw a widget).
    """

    def __init__(
        self,
        runner: ModelRunner,
        cache: PooledKVCache,
        scheduler_config: SchedulerConfig | None = None,
        *,
        num_cpu_blocks: int = 0,
        scheduler_class: type[Scheduler] = Scheduler,
        clock=None,
        tokenizer=None,
        eos_token_id: int | None = None,
        max_model_len: int | None = None,
        seed: int = 0,
        on_step: StepCallback | None = None,
    ) -> None:
        if not isinstance(cache, PooledKVCache):
            raise TypeError(
                f"cache={cache!r} is not allowed: the engine needs a pooled cache "
                "(kvlab.cache.PagedKVCache or ContiguousKVCache)"
            )
        self.runner = runner
        self.cache = cache
        self.kv = cache.manager
        scheduler_config = scheduler_config or SchedulerConfig()
        self.scheduler = scheduler_class(scheduler_config, self.kv, num_cpu_blocks)
        swapping = scheduler_config.preemption_mode == "swap"
        self.swap_space = SwapSpace(cache, num_cpu_blocks) if swapping else None
        self.clock = clock if clock is not None else WallClock()
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len or runner.config.max_position_embeddings
        self.vocab_size = runner.config.vocab_size
        self.on_step = on_step
        self.metrics = RunMetrics()
        self._seed_generator = torch.Generator().manual_seed(seed)
        self._seq_ids = itertools.count()
        self._arrivals = Arrivals()  # accepted requests whose arrival time is ahead
        self._samples: dict[str, list[Request]] = {}  # request_id -> its samples
        self._prompts: dict[str, str | None] = {}
        self._num_steps = 0
        self.last_step_work: StepWork | None = None  # what the last step computed

    @property
    def scheduler_config(self) -> SchedulerConfig:
        return self.scheduler.config

    def reset_metrics(self) -> None:
        """Start measuring afresh (``LLM.generate`` does this at every call)."""
        self.metrics = RunMetrics()
        self.scheduler.reset_counters()

    # ---- requests ------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | Sequence[int],
        sampling_params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> None:
        """Queue a request; it is seen by the scheduler once the clock passes ``arrival_time``.

        Raises:
            ValueError: the request is refused (the message says why); nothing changes, and
                the engine goes on serving the other requests.
        """
        request_id = str(request_id)
        if request_id in self._samples:
            raise ValueError(f"request_id={request_id!r} is already used by an unfinished request")
        params = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(
                f"sampling_params={params!r} is not allowed: use a kvlab.SamplingParams"
            )
        ids = prompt_token_ids(request_id, prompt, self.tokenizer, self.vocab_size)
        check_fits(request_id, ids, params, self.kv, self.max_model_len)
        arrival = checked_arrival(arrival_time, self.clock.now())
        check_priority(priority)
        request = Request(
            request_id=request_id,
            seq_id=next(self._seq_ids),
            prompt_token_ids=ids,
            sampling_params=params,
            arrival_time=arrival,
            priority=priority,
            eos_token_id=self.eos_token_id,
            max_model_len=self.max_model_len,
        )
        if not params.greedy:
            request.base_seed = params.seed if params.seed is not None else self._draw_seed()
            request.generator = make_generator(request.base_seed, self.runner.device)
        self._samples[request_id] = [request]
        self._prompts[request_id] = prompt if isinstance(prompt, str) else None
        self._arrivals.add(request)

    def abort_request(self, request_id: str) -> None:
        """Stop a request wherever it is; its memory is released at once."""
        samples = self._samples.pop(str(request_id), None)
        if samples is None:
            return
        arrived = not self._arrivals.remove(str(request_id))  # samples fork after arrival
        self._prompts.pop(str(request_id), None)
        for request in samples:
            if request.status is not RequestStatus.FINISHED:
                if arrived:
                    self.scheduler.finish(request)
                request.status = RequestStatus.FINISHED
                request.finish_reason = "abort"

    def seq_id_of(self, request_id: str) -> int:
        """The cache's ``seq_id`` of an unfinished request's first sample."""
        samples = self._samples.get(str(request_id))
        if samples is None:
            raise ValueError(f"request_id={request_id!r} is not an unfinished request here")
        return samples[0].seq_id

    def has_unfinished_requests(self) -> bool:
        return bool(self._arrivals) or self.scheduler.has_unfinished()

    # ---- one step ------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one iteration: admit, allocate, compute, sample, free.

        Returns:
            one ``RequestOutput`` per request that got a new token this step (finished
            ones included; a running one only if its ``output_kind`` is "cumulative").
            When nothing can run yet, the clock moves on to the next arrival (or batch
            timeout) and the list is empty.
        """
        now = self.clock.now()
        self._move_arrivals(now)
        out = self.scheduler.schedule(now)
        if not out:
            self._idle(now)
            return []
        if self.metrics.start_time is None:
            self.metrics.start_time = now
        if self.swap_space is not None:
            self.scheduler.prefetch(out)  # copy back early what the next step may resume
        self._move_blocks(out)
        logits, work = self._forward(out)  # (num_seqs, vocab_size), what the step computed
        self.last_step_work = work
        self.clock.tick(work)  # a StepCostClock makes the step last what its work costs
        now = self.clock.now()
        finished, touched = self._update(out, logits, now)
        self.scheduler.finish_running(finished)
        outputs = [self._output(request_id) for request_id in touched]
        outputs = [output for output in outputs if output is not None]
        self._record_step(out, finished, work.num_decode_seqs, now)
        return outputs

    def _move_blocks(self, out: SchedulerOutput) -> None:
        """Make the step's planned copies, each block read before it is overwritten.

        Swapped-out blocks go to CPU memory first (the scheduler freed them, and this step
        may reuse them), then the copy-on-write copies, then the copies back: those the
        step waits for, and the prefetches that overlap it (a GPU copies on a side stream).
        """
        swap = self.swap_space
        if swap is not None:
            swap.wait()  # copies back of earlier steps are done before their blocks move
            swap.swap_out(out.blocks_to_swap_out)
        self.cache.copy_blocks(out.blocks_to_copy)
        if swap is not None:
            swap.swap_in(out.blocks_to_swap_in)
            swap.wait()
            swap.swap_in(out.blocks_to_prefetch)

    def _forward(self, out: SchedulerOutput) -> tuple[torch.Tensor, StepWork]:
        """Run the model on the step's packed batch; the logits and what the step computed."""
        ids, batch, work = pack_step(out, self.runner.device)
        return self.runner.forward(ids, batch, self.cache), work

    def _idle(self, now: float) -> None:
        """Nothing can run: wait for the next arrival or the dynamic batch's timeout."""
        times = [self._arrivals.next_time(), self.scheduler.next_wakeup()]
        times = [t for t in times if t is not None and t > now]
        if times:
            self.clock.advance_to(min(times))
        elif self.scheduler.has_unfinished():
            raise RuntimeError(
                f"the scheduler can run nothing: {len(self.scheduler.waiting)} waiting, "
                f"{len(self.scheduler.running)} running, {len(self.scheduler.swapped)} "
                "swapped. This is a bug in kvlab: please report it."
            )

    def _move_arrivals(self, now: float) -> None:
        for request in self._arrivals.pop_arrived(now):
            self.scheduler.add_request(request)

    def _update(self, out: SchedulerOutput, logits: torch.Tensor, now: float):
        """Count computed tokens, sample where a sequence is complete, fork, spot the finished.

        Returns:
            the finished samples, and the ids of the requests to report (those that got a
            token: all, for "cumulative" output; only finished ones for "final_only").
        """
        # NOTE: both loops run over every running sequence every step: lengths are read
        # with len() rather than through the Request's properties.
        rows = []
        for i, (request, num_new) in enumerate(zip(out.requests, out.num_new_tokens, strict=True)):
            request.num_computed_tokens += num_new
            if request.num_computed_tokens == len(request.token_ids):
                rows.append(i)  # a prefill chunk that is not the last one samples nothing
        if len(rows) == len(out.requests):  # every row samples (any step without a chunk)
            sampled, tokens = out.requests, sample(logits, out.requests)
        else:
            sampled = [out.requests[i] for i in rows]
            tokens = sample(logits[rows], sampled) if rows else []
        finished, touched = [], {}
        for i, request, token in zip(rows, sampled, tokens, strict=True):
            if request.first_token_time is None:
                request.first_token_time = now
            elif now - request.last_token_time > request.max_token_gap:
                request.max_token_gap = now - request.last_token_time
            request.last_token_time = now
            if request.sampling_params.n > 1 and not request.output_token_ids:
                finished.extend(self._fork(request, logits[i], now))
            if request.append_token(token):
                request.finished_time = now
                finished.append(request)
                touched[request.request_id] = None
            elif request.sampling_params.output_kind == "cumulative":
                touched[request.request_id] = None  # a running request reports every token
        return finished, list(touched)

    def _fork(self, parent: Request, logits_row: torch.Tensor, now: float) -> list[Request]:
        """Start samples 1..n-1 of ``parent``, sharing its prompt's blocks; return finished."""
        children = []
        for index in range(1, parent.sampling_params.n):
            generator = None
            if parent.base_seed is not None:
                generator = make_generator(parent.base_seed + index, self.runner.device)
            child = parent.fork(next(self._seq_ids), index, generator)
            child.first_token_time = child.last_token_time = now
            children.append(child)
        tokens = sample(logits_row.expand(len(children), -1), children)
        finished = []
        for child, token in zip(children, tokens, strict=True):
            self._samples[parent.request_id].append(child)
            done = child.append_token(token)
            if done:
                child.finished_time = now
            try:
                self.cache.fork(parent.seq_id, child.seq_id)
            except CacheFullError:
                self.scheduler.fork_failed(child)  # it waits, or finishes if it is done
                continue
            self.scheduler.add_forked(child)
            if done:
                finished.append(child)
        return finished

    # ---- outputs and metrics -------------------------------------------------------------

    def _output(self, request_id: str) -> RequestOutput | None:
        """The request's output now (None while it runs, if it asked for the final one)."""
        output = request_output(
            request_id, self._samples[request_id], self._prompts[request_id], self._decode
        )
        if output is not None and output.finished:
            self.metrics.requests.append(output.metrics)
            del self._samples[request_id], self._prompts[request_id]
        return output

    def _record_step(
        self, out: SchedulerOutput, finished: list[Request], num_decode: int, now: float
    ) -> None:
        scheduler = self.scheduler
        stats = StepStats.of(self._num_steps, now, out, finished, num_decode, scheduler)
        self._num_steps += 1
        metrics = self.metrics
        metrics.steps.append(stats)
        metrics.end_time = now
        metrics.num_preemptions = scheduler.num_preemptions
        metrics.num_swap_outs = scheduler.num_swap_outs
        metrics.num_swap_ins = scheduler.num_swap_ins
        metrics.num_prefetched = scheduler.num_prefetched
        metrics.num_prompt_tokens_queried = scheduler.num_prompt_tokens_queried
        metrics.num_prompt_tokens_hit = scheduler.num_prompt_tokens_hit
        if self.on_step is not None:
            self.on_step(stats)

    # ---- checks and helpers --------------------------------------------------------------

    def _draw_seed(self) -> int:
        """A seed for a sampled request that brings none (reproducible from the engine's)."""
        return int(torch.randint(0, 2**62, (), generator=self._seed_generator))

    def _decode(self, token_ids: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)


def pack_step(out: SchedulerOutput, device) -> tuple[torch.Tensor, ForwardBatch, StepWork]:
    """The step's plan packed into one flat batch: the ``input_ids`` (num_tokens,), the
    ``ForwardBatch``, and what the step computes (``StepWork``, for the step-cost clock).

    The new tokens of all sequences, one after another, in one row, and a ``ForwardBatch``
    that says where each sequence's tokens start and how much context it already has (the
    cache turns that into the block table and slot mapping); no padding:

        out.requests      r0 (prefill chunk of 3)    r1 (decode)    r2 (decode)
        input_ids         [t0, t1, t2,               t7,            t4]
        query_start_loc   [0,                        3,             4,           5]
    """
    seq_ids, num_computed, input_ids = [], [], []
    num_decode = context = pairs = 0
    for request, num_new in zip(out.requests, out.num_new_tokens, strict=True):
        start = request.num_computed_tokens
        seq_ids.append(request.seq_id)
        num_computed.append(start)
        context += start + num_new
        if num_new == 1:
            input_ids.append(request.token_ids[start])
            pairs += start + 1
            # A decode computes the token sampled last step: it is past the prompt.
            num_decode += start >= len(request.prompt_token_ids)
        else:
            input_ids.extend(request.token_ids[start : start + num_new])
            pairs += num_new * start + num_new * (num_new + 1) // 2
    batch = ForwardBatch.build(seq_ids, num_computed, out.num_new_tokens, device)
    ids = torch.tensor(input_ids, dtype=torch.long, device=device)
    work = StepWork(
        num_prefill_tokens=out.num_tokens - num_decode,
        num_decode_seqs=num_decode,
        num_context_tokens=context,
        num_attention_pairs=pairs,
        num_blocks_copied=len(out.blocks_to_copy),
        num_blocks_swapped=out.num_blocks_swapped,
        num_blocks_prefetched=out.num_blocks_prefetched,
    )
    return ids, batch, work


# ---- intake: what add_request checks, and the requests still to arrive -------------------
#
# A refused request raises ``ValueError`` with a message that names the request, the value
# and what is allowed, and changes nothing: the engine goes on serving the others.


def prompt_token_ids(request_id: str, prompt, tokenizer, vocab_size: int) -> list[int]:
    """The prompt as a list of token ids (a string goes through ``tokenizer``)."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError(
                f"request {request_id!r}: a text prompt needs a tokenizer, and this model "
                "has none: pass token ids (a list of ints)"
            )
        prompt = tokenizer(prompt)["input_ids"]
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.tolist()
    try:
        ids = list(prompt)
    except TypeError:
        raise ValueError(
            f"request {request_id!r}: prompt={prompt!r} is not allowed: use a string or "
            "a list of token ids"
        ) from None
    if not ids:
        raise ValueError(f"request {request_id!r}: the prompt is empty; give at least 1 token")
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int)]
    bad += [t for t in ids if isinstance(t, int) and not 0 <= t < vocab_size]
    if bad:
        raise ValueError(
            f"request {request_id!r}: token id {bad[0]!r} is not allowed: use ints in "
            f"[0, {vocab_size}) (the model's vocab_size)"
        )
    return ids


def check_fits(
    request_id: str,
    prompt: list[int],
    params: SamplingParams,
    kv: KVCacheManager,
    max_model_len: int,
) -> None:
    """Refuse a request that could never run, even alone: too long, or too big for KV."""
    if len(prompt) >= max_model_len:
        raise ValueError(
            f"request {request_id!r}: the prompt has {len(prompt)} tokens; the model's "
            f"context (max_model_len) is {max_model_len}, so a prompt may have at most "
            f"{max_model_len - 1} (one output token must fit)"
        )
    reason = kv.check_request(len(prompt), params.max_tokens, max_model_len)
    if reason is not None:
        raise ValueError(
            f"request {request_id!r}: {reason}: lower max_tokens or give the engine more KV memory"
        )


def checked_arrival(arrival_time, now: float) -> float:
    """When the request arrives: ``arrival_time``, or ``now`` when it is None."""
    arrival = now if arrival_time is None else arrival_time
    if (
        isinstance(arrival, bool)
        or not isinstance(arrival, int | float)
        or not math.isfinite(arrival)
    ):
        raise ValueError(f"arrival_time={arrival_time!r} is not allowed: use seconds (finite)")
    return float(arrival)


def check_priority(priority) -> None:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority={priority!r} is not allowed: use an int (lower runs first)")


class Arrivals:
    """Accepted requests that have not arrived yet, earliest first (ties: first added).

    The scheduler sees a request only once the clock passes its arrival time, so that a
    trace replays its arrivals over time.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Request]] = []

    def __bool__(self) -> bool:
        return bool(self._heap)

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.arrival_time, request.seq_id, request))

    def next_time(self) -> float | None:
        """When the earliest pending request arrives; None if none is pending."""
        return self._heap[0][0] if self._heap else None

    def pop_arrived(self, now: float) -> list[Request]:
        """The requests that have arrived by ``now``, in arrival order."""
        arrived = []
        while self._heap and self._heap[0][0] <= now:
            arrived.append(heapq.heappop(self._heap)[2])
        return arrived

    def remove(self, request_id: str) -> bool:
        """Drop a request that has not arrived yet; whether it was pending."""
        kept = [entry for entry in self._heap if entry[2].request_id != request_id]
        found = len(kept) != len(self._heap)
        self._heap = kept
        heapq.heapify(self._heap)
        return found
