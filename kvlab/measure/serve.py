"""Serving real requests through one KV cache, the way labs 02 and 03 do.

``serve`` is greedy generation for a list of requests, where each request deals with the
cache the way a server's requests do (``kvlab.model.greedy.greedy_generate`` does none of
it): it declares itself (``add_request``: a contiguous reservation, or a paged
prefix-cache lookup that may skip part of its prefill), names the tokens it stores (so
full blocks get a ``block_hash``), may arrive at a later step, and is *refused*, with the
cache's reason, when it does not fit, while the requests already running go on.

Not handled: preemption (a running sequence that cannot grow raises ``CacheFullError``;
lab 04's scheduler preempts instead), sampling (greedy only), chunked prefill.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvlab.cache.base import KVCache
from kvlab.cache.manager import CacheFullError
from kvlab.cache.step import ForwardBatch
from kvlab.model.runner import ModelRunner

StepCallback = Callable[[int, KVCache], None]


@dataclass(frozen=True)
class ServeResult:
    """What ``serve`` did with each request, in the order of the prompts.

    Attributes:
        outputs: the new token ids of each request; None for a refused one.
        refused: request index -> the cache's reason for refusing it.
        num_cached_tokens: prompt tokens each request found in the prefix cache (their
            K/V were reused, not computed).
        num_steps: forward steps run.
        final_slots: ``seq_id -> slots it had written when it ended`` (prompt + outputs
            - 1: its last token is never fed back), for each request that ran.
    """

    outputs: list[list[int] | None]
    refused: dict[int, str]
    num_cached_tokens: list[int]
    num_steps: int
    final_slots: dict[int, int]


def serve(
    runner: ModelRunner,
    cache: KVCache,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_token_id: int | None = None,
    arrival_steps: Sequence[int] | None = None,
    max_tokens: Sequence[int] | None = None,
    on_step: StepCallback | None = None,
    seq_ids: Sequence[int] | None = None,
) -> ServeResult:
    """Generate greedily for every request that the cache admits.

    Each step: the running requests take a slot for their newest token, then the requests
    arriving now are admitted in order (or refused), then one forward pass runs them all.

    Args:
        runner: the model.
        cache: any ``KVCache``.
        prompts: token ids of each request.
        max_new_tokens: tokens each request generates at most (fewer when EOS comes).
        eos_token_id: ends a request when generated; None never stops early.
        arrival_steps: the step at which each request arrives (default: all at step 0).
        max_tokens: the output length each request declares to ``add_request``, from which
            a contiguous reservation is sized (default: ``max_new_tokens``). An oracle
            passes the true output lengths.
        on_step: called after every forward pass as ``on_step(step, cache)``, before the
            requests that just finished free their memory (the cache at its fullest).
        seq_ids: each request's ``seq_id`` in the cache (default: 0, 1, 2, ...); other
            sequences the cache holds stay untouched.

    Raises:
        CacheFullError: a running request cannot grow (nothing here preempts); everything
            the requests held is freed first.
    """
    num = len(prompts)
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be > 0, got {max_new_tokens}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    arrivals = list(arrival_steps) if arrival_steps is not None else [0] * num
    declared = list(max_tokens) if max_tokens is not None else [max_new_tokens] * num
    ids = list(seq_ids) if seq_ids is not None else list(range(num))
    if not len(arrivals) == len(declared) == len(ids) == num or len(set(ids)) != num:
        raise ValueError(
            "arrival_steps, max_tokens and seq_ids need one entry per prompt (distinct seq_ids)"
        )
    outputs: list[list[int] | None] = [None] * num
    refused: dict[int, str] = {}
    num_cached = [0] * num
    pending: dict[int, list[int]] = {}  # running request -> tokens to feed this step
    computed: dict[int, int] = {}  # running request -> tokens with K/V in the cache
    queue = sorted(range(num), key=lambda i: (arrivals[i], i))
    step = num_steps = 0
    try:
        while queue or pending:
            for i, tokens in pending.items():  # decodes: one new token each
                _allocate(cache, ids[i], tokens)
            while queue and arrivals[queue[0]] <= step:
                i = queue.pop(0)
                cached, reason = _admit(cache, ids[i], list(prompts[i]), declared[i])
                if reason is not None:
                    refused[i] = reason
                    continue
                num_cached[i], computed[i], outputs[i] = cached, cached, []
                pending[i] = list(prompts[i][cached:])
            if not pending:
                step = arrivals[queue[0]] if queue else step
                continue
            running = list(pending)
            next_tokens = greedy_step(
                runner,
                cache,
                [ids[i] for i in running],
                [computed[i] for i in running],
                [pending[i] for i in running],
            )
            finished = []
            for i, token in zip(running, next_tokens, strict=True):
                computed[i] += len(pending[i])
                outputs[i].append(token)
                pending[i] = [token]
                if len(outputs[i]) == max_new_tokens or token == eos_token_id:
                    finished.append(i)
            if on_step is not None:
                on_step(step, cache)
            for i in finished:
                cache.free(ids[i])
                del pending[i]
            step += 1
            num_steps += 1
    finally:
        for i in pending:
            cache.free(ids[i])
    final_slots = {
        ids[i]: len(prompts[i]) + len(out) - 1 for i, out in enumerate(outputs) if out is not None
    }
    return ServeResult(outputs, refused, num_cached, num_steps, final_slots)


def greedy_step(
    runner: ModelRunner,
    cache: KVCache,
    seq_ids: list[int],
    num_computed: list[int],
    new_tokens: list[list[int]],
) -> list[int]:
    """One forward pass over tokens that already have their slots; each sequence's argmax.

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


def _admit(
    cache: KVCache, seq_id: int, prompt: list[int], max_tokens: int
) -> tuple[int, str | None]:
    """Declare a request and allocate its prompt: (prompt tokens already cached, refusal)."""
    try:
        cached = cache.add_request(seq_id, prompt, max_tokens)
        _allocate(cache, seq_id, prompt[cached:])
    except (CacheFullError, ValueError) as error:
        if seq_id in cache:  # a paged request adopted cached blocks, then failed
            cache.free(seq_id)
        return 0, str(error)
    return cached, None


def _allocate(cache: KVCache, seq_id: int, token_ids: list[int]) -> None:
    cache.allocate_slots(seq_id, len(token_ids), token_ids=token_ids)
