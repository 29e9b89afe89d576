"""Experiments of the allocator labs: run real requests through a KV cache, then measure it.

Labs 02 (contiguous) and 03 (paged) ask each allocator the same questions:

* ``serve``: greedy generation for a list of requests, where each request deals with the
  cache the way a server's requests do (``kvlab.model.greedy.greedy_generate`` does none of it):
  it declares itself (``add_request``: a contiguous reservation, or a paged prefix-cache
  lookup that may skip part of its prefill), names the tokens it stores (so full blocks get
  a ``block_hash``), may arrive at a later step, and is *refused*, with the cache's reason,
  when it does not fit, while the requests already running go on.
* ``fragmentation``: where a cache's token slots are at this moment:

      capacity = used + internal + external + free
      used      slots holding a token of a live sequence
      internal  reserved by a sequence but empty (a contiguous over-reservation, the empty
                tail of a sequence's last block)
      external  free, but in holes too small for the request at hand (contiguous only:
                any free block serves any paged request)

* ``max_concurrency``: the most requests of a workload that run together in one cache
  from their first token to their last, found by replaying the allocations only (no model).
* ``block_size_tradeoff``: what each block size costs in empty slots and in block-table
  entries (the seed article's pitfall: "lowest memory is not always best").

Not handled: preemption (a running sequence that cannot grow raises ``CacheFullError``;
lab 04's scheduler preempts instead), sampling (greedy only), chunked prefill.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvlab.cache.base import KVCache, PooledKVCache
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.manager import CacheFullError
from kvlab.cache.step import ForwardBatch
from kvlab.model.runner import ModelRunner

StepCallback = Callable[[int, KVCache], None]

# ---- serving real requests ------------------------------------------------------------------


@dataclass(frozen=True)
class ServeResult:
    """What ``serve`` did with each request, in the order of the prompts.

    Attributes:
        outputs: the new token ids of each request; None for a refused one.
        refused: request index -> the cache's reason for refusing it.
        num_cached_tokens: prompt tokens each request found in the prefix cache (their
            K/V were reused, not computed).
        num_steps: forward steps run.
    """

    outputs: list[list[int] | None]
    refused: dict[int, str]
    num_cached_tokens: list[int]
    num_steps: int


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
    return ServeResult(outputs, refused, num_cached, num_steps)


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
        if _holds(cache, seq_id):  # a paged request adopted cached blocks, then failed
            cache.free(seq_id)
        return 0, str(error)
    return cached, None


def _allocate(cache: KVCache, seq_id: int, token_ids: list[int]) -> None:
    cache.allocate_slots(seq_id, len(token_ids), token_ids=token_ids)


def _holds(cache: KVCache, seq_id: int) -> bool:
    try:
        cache.num_tokens(seq_id)
    except KeyError:
        return False
    return True


# ---- fragmentation --------------------------------------------------------------------------


@dataclass(frozen=True)
class Fragmentation:
    """Where a KV pool's token slots are at one moment (a shared block counts once).

    Attributes:
        capacity: slots in the pool.
        used: slots holding a token of a live sequence.
        internal: slots reserved by a sequence but holding none of its tokens.
        external: free slots in holes too small for the request asked about.
        bytes_per_slot: K and V bytes of one slot, all layers.
    """

    capacity: int
    used: int
    internal: int
    external: int
    bytes_per_slot: int

    @property
    def reserved(self) -> int:
        return self.used + self.internal

    @property
    def free(self) -> int:
        """Free slots a request can use."""
        return self.capacity - self.reserved - self.external

    @property
    def wasted(self) -> int:
        """Slots that hold no token although memory is short: internal + external."""
        return self.internal + self.external

    def share(self, slots: int) -> float:
        """``slots`` as a fraction of the capacity."""
        return slots / self.capacity

    def __str__(self) -> str:
        parts = [
            f"{name} {value:,} ({self.share(value):.1%})"
            for name, value in (
                ("used", self.used),
                ("internal", self.internal),
                ("external", self.external),
                ("free", self.free),
            )
        ]
        return f"{self.capacity:,} slots: " + ", ".join(parts)


def fragmentation(cache: PooledKVCache, request_size: int | None = None) -> Fragmentation:
    """Measure ``cache`` now: used, internal, external and free slots.

    Args:
        cache: a pooled cache (contiguous or paged).
        request_size: slots the next request needs; external fragmentation counts the free
            slots in holes shorter than that. None: every free slot outside the largest
            hole (what no single request can use). Ignored for paged caches.
    """
    kv = cache.manager
    usage = kv.usage()
    return Fragmentation(
        capacity=usage.num_slots,
        used=usage.num_used_slots,
        internal=usage.num_reserved_slots - usage.num_used_slots,
        external=kv.external_fragmentation(request_size),
        bytes_per_slot=cache.bytes_per_slot,
    )


# ---- how many requests fit at once ----------------------------------------------------------


@dataclass(frozen=True)
class Concurrency:
    """The answer of ``max_concurrency``.

    Attributes:
        num_seqs: the most requests that ran together with no allocation refused.
        refusal: the cache's message when one more was tried ("" if ``limit`` was reached).
    """

    num_seqs: int
    refusal: str


def max_concurrency(
    make_cache: Callable[[], KVCache],
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    max_tokens: Sequence[int] | None = None,
    limit: int = 4096,
) -> Concurrency:
    """The most requests of a workload that run together in one cache, start to finish.

    Request ``i`` has ``prompt_lens[i % k]`` prompt tokens and generates ``output_lens[i % k]``
    (the workload repeats). As in ``serve``, all of them start at step 0 and each step
    every unfinished one stores one more token; ``n`` requests fit when no allocation is
    refused on the way. Only the allocations are replayed, in a fresh ``make_cache()`` per
    try: no model runs. More requests never need less memory, so a binary search finds
    the answer.

    Args:
        make_cache: builds an empty cache (the same budget every time).
        prompt_lens, output_lens: the workload's request lengths.
        max_tokens: output lengths the requests declare to ``add_request`` (default:
            ``output_lens``, i.e. an oracle that knows them).
        limit: stop searching here (a cache without a memory limit never refuses).
    """
    if len(prompt_lens) != len(output_lens) or not prompt_lens:
        raise ValueError("prompt_lens and output_lens need the same, non-zero length")
    if min(prompt_lens) <= 0 or min(output_lens) <= 0:
        raise ValueError("every request needs at least one prompt and one output token")
    declared = list(max_tokens) if max_tokens is not None else list(output_lens)
    workload = list(zip(prompt_lens, output_lens, declared, strict=True))

    def refusal(num_seqs: int) -> str | None:
        requests = [workload[i % len(workload)] for i in range(num_seqs)]
        return _replay(make_cache(), requests)

    fits, refused, why = 0, 0, ""
    num_seqs = 1
    while not refused:
        reason = refusal(num_seqs)
        if reason is not None:
            refused, why = num_seqs, reason
        elif num_seqs >= limit:
            return Concurrency(num_seqs, "")
        else:
            fits, num_seqs = num_seqs, min(2 * num_seqs, limit)
    while refused - fits > 1:
        middle = (fits + refused) // 2
        reason = refusal(middle)
        if reason is None:
            fits = middle
        else:
            refused, why = middle, reason
    return Concurrency(fits, why)


def _replay(cache: KVCache, requests: list[tuple[int, int, int]]) -> str | None:
    """Allocate like ``serve`` for requests (prompt_len, output_len, max_tokens) started
    together; the first refusal's message, or None when all of them finish."""
    next_id = 0
    try:
        for seq_id, (prompt_len, _, declared) in enumerate(requests):
            # Distinct made-up token ids: no request finds another's blocks in a prefix cache.
            prompt = list(range(next_id, next_id + prompt_len))
            next_id += prompt_len
            cache.add_request(seq_id, prompt, declared)
            cache.allocate_slots(seq_id, prompt_len)
        # Step s (s >= 1) feeds output token s; a request with n output tokens feeds n - 1
        # of them (its last one is never fed back), then frees its memory.
        longest = max(output_len for _, output_len, _ in requests)
        for step in range(1, longest):
            for seq_id, (_, output_len, _) in enumerate(requests):
                if output_len == step:
                    cache.free(seq_id)
                elif output_len > step:
                    cache.allocate_slots(seq_id, 1)
    except (CacheFullError, ValueError) as error:
        return str(error)
    return None


# ---- the block-size trade-off ---------------------------------------------------------------


@dataclass(frozen=True)
class BlockSizeCost:
    """What one block size costs to hold a set of sequences.

    Attributes:
        block_size: tokens per block.
        num_tokens: tokens the sequences hold.
        num_slots: slots in the blocks they hold (what a paged kernel reads: it loads
            whole blocks and masks the empty tail).
        table_entries: block-table entries of all sequences (one per block held: one
            lookup each for the kernel, and the table the engine builds every step).
    """

    block_size: int
    num_tokens: int
    num_slots: int
    table_entries: int

    @property
    def waste(self) -> float:
        """Share of the held slots that are empty (internal fragmentation)."""
        return 1 - self.num_tokens / self.num_slots


def block_size_tradeoff(
    seq_lens: Sequence[int], block_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
) -> list[BlockSizeCost]:
    """Allocate sequences of ``seq_lens`` tokens with each block size and count the cost."""
    if not seq_lens or min(seq_lens) <= 0:
        raise ValueError("seq_lens must be a non-empty list of positive lengths")
    costs = []
    for block_size in block_sizes:
        num_blocks = sum(-(-n // block_size) for n in seq_lens)
        manager = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        for seq_id, seq_len in enumerate(seq_lens):
            manager.allocate_slots(seq_id, seq_len)
        entries = sum(len(manager.block_table(seq_id)) for seq_id in range(len(seq_lens)))
        costs.append(BlockSizeCost(block_size, sum(seq_lens), entries * block_size, entries))
    return costs
