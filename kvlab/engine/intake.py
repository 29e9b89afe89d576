"""What ``LLMEngine.add_request`` checks before a request joins the queue.

A refused request raises ``ValueError`` with a message that names the request, the value
and what is allowed, and changes nothing: the engine goes on serving the others.

    prompt_token_ids   text (through the tokenizer) or token ids, each in the vocabulary
    check_fits         the prompt leaves room for an output token in max_model_len, and
                       the request could run alone in the KV pool (the cache says why not)
    checked_arrival    a finite time in seconds (default: now)
    check_priority     an int, lower runs first
    Arrivals           the accepted requests whose arrival time is still ahead, in order

Not handled: stop strings, multi-modal prompts.
"""

from __future__ import annotations

import heapq
import math

import torch

from kvlab.cache.manager import KVCacheManager
from kvlab.engine.request import Request
from kvlab.engine.sampling_params import SamplingParams


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
