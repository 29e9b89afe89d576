"""Measurements of the allocator labs: where a cache's slots are, and how many requests fit.

Labs 02 (contiguous) and 03 (paged) serve real requests (``kvlab.measure.serve``), then
ask each allocator the same questions:

* ``fragmentation``: where a cache's token slots are at this moment:

      capacity = used + reservation + internal + external + free
      used         slots holding a token of a live sequence (the paper's token states)
      reservation  held by a sequence for tokens it will still write (known only in
                   hindsight: ``kvlab.labs.Recording.in_hindsight``; 0 otherwise)
      internal     held by a sequence but never written (a contiguous over-reservation,
                   the empty tail of a sequence's last block)
      external     free, but in holes too small for the request at hand (contiguous only:
                   any free block serves any paged request)

* ``max_concurrency``: the most requests of a workload that run together in one cache
  from their first token to their last, found by serving them through the engine with no
  model (``kvlab.engine.model_free``).
* ``block_size_tradeoff``: what each block size costs in empty slots and in block-table
  entries (the seed article's pitfall: "lowest memory is not always best").

Not handled: preemption (lab 04's scheduler preempts), prefix sharing between the
requests of ``max_concurrency`` (each gets distinct token ids).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvlab.cache.base import PooledKVCache
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.manager import CacheFullError
from kvlab.engine.model_free import ModelFreeRunner
from kvlab.engine.sampling_params import SamplingParams
from kvlab.measure.serve import seat_everyone

# ---- fragmentation --------------------------------------------------------------------------


@dataclass(frozen=True)
class Fragmentation:
    """Where a KV pool's token slots are at one moment (a shared block counts once).

    Attributes:
        capacity: slots in the pool.
        used: slots holding a token of a live sequence.
        internal: slots held by a sequence but holding none of its tokens (all of them
            until ``reservation`` is split off in hindsight: then only those never written).
        external: free slots in holes too small for the request asked about.
        bytes_per_slot: K and V bytes of one slot, all layers.
        reservation: held slots that the sequence writes later (0 unless known).
    """

    capacity: int
    used: int
    internal: int
    external: int
    bytes_per_slot: int
    reservation: int = 0

    @property
    def reserved(self) -> int:
        """Slots held by sequences: used, reservation and internal."""
        return self.used + self.reservation + self.internal

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
                *((("reservation", self.reservation),) if self.reservation else ()),
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
        num_seqs: the most requests that ran together, start to finish, with none waiting
            and none preempted.
        reason: what stopped one more, in words ("" if ``limit`` was reached).
    """

    num_seqs: int
    reason: str


def max_concurrency(
    make_cache: Callable[[], PooledKVCache],
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    max_tokens: Sequence[int] | None = None,
    limit: int = 4096,
) -> Concurrency:
    """The most requests of a workload that run together in one cache, start to finish.

    Request ``i`` has ``prompt_lens[i % k]`` prompt tokens and generates ``output_lens[i % k]``
    (the workload repeats). ``n`` requests arrive together at step 0 of ``LLMEngine`` over a
    fresh ``make_cache()``, with ``n`` seats and no token budget; they fit when all of them
    start in the first step and none is preempted before it ends. The model is
    ``ModelFreeRunner``, which ends every request at its output length: only the cache's
    bookkeeping does real work. More requests never need less memory, so a binary search
    finds the answer.

    Args:
        make_cache: builds an empty cache (the same budget every time).
        prompt_lens, output_lens: the workload's request lengths.
        max_tokens: output lengths the requests declare (a contiguous cache reserves from
            them; default: ``output_lens``, i.e. a clairvoyant allocator that knows them).
        limit: stop searching here.
    """
    if len(prompt_lens) != len(output_lens) or not prompt_lens:
        raise ValueError("prompt_lens and output_lens need the same, non-zero length")
    if min(prompt_lens) <= 0 or min(output_lens) <= 0:
        raise ValueError("every request needs at least one prompt and one output token")
    declared = list(max_tokens) if max_tokens is not None else list(output_lens)
    if len(declared) != len(output_lens):
        raise ValueError("max_tokens needs one entry per request of the workload")
    if any(d < o for d, o in zip(declared, output_lens, strict=True)):
        raise ValueError("max_tokens must be at least each request's output length")
    workload = list(zip(prompt_lens, output_lens, declared, strict=True))

    def why_not(num_seqs: int) -> str | None:
        requests = [workload[i % len(workload)] for i in range(num_seqs)]
        return _run_together(make_cache(), requests)

    fits, refused, why = 0, 0, ""
    num_seqs = 1
    while not refused:
        reason = why_not(num_seqs)
        if reason is not None:
            refused, why = num_seqs, reason
        elif num_seqs >= limit:
            return Concurrency(num_seqs, "")
        else:
            fits, num_seqs = num_seqs, min(2 * num_seqs, limit)
    while refused - fits > 1:
        middle = (fits + refused) // 2
        reason = why_not(middle)
        if reason is None:
            fits = middle
        else:
            refused, why = middle, reason
    return Concurrency(fits, why)


def _run_together(cache: PooledKVCache, requests: list[tuple[int, int, int]]) -> str | None:
    """Serve requests (prompt_len, output_len, max_tokens) arriving together, through the
    engine with no model; None when all ran at once to the end, else what stopped them."""
    runner = ModelFreeRunner(vocab_size=1 << 40)
    num = len(requests)
    prompt_lens = [prompt_len for prompt_len, _, _ in requests]
    engine = seat_everyone(runner, cache, prompt_lens, eos_token_id=ModelFreeRunner.EOS)
    prompts, next_id = [], 2  # token ids 0 and 1 are the runner's outputs
    for i, (prompt_len, output_len, declared) in enumerate(requests):
        # Distinct made-up token ids: no request finds another's blocks in a prefix cache.
        prompts.append(list(range(next_id, next_id + prompt_len)))
        next_id += prompt_len
        params = SamplingParams(temperature=0, max_tokens=declared)
        try:
            engine.add_request(str(i), prompts[i], params)
        except ValueError as error:
            return str(error)
        runner.stop_after(engine.seq_id_of(str(i)), prompt_len, output_len)
    while engine.has_unfinished_requests():
        engine.step()
        step = engine.metrics.steps[-1]
        if step.step == 0 and step.num_waiting:
            first = num - step.num_waiting  # first come, first served: the rest wait behind it
            why = f"request {first} could not start with the others"
            if step.finished:  # the pool is no longer as admission saw it
                return why
            seq_id = engine.seq_id_of(str(first))
            return f"{why}: " + _why_waiting(
                cache.manager, seq_id, prompts[first], requests[first][2]
            )
        if step.preempted:
            return (
                f"at step {step.step} the pool ran out and request {step.preempted[0]} was "
                f"preempted ({cache.manager.num_free_blocks} blocks free)"
            )
    return None


def _why_waiting(kv, seq_id: int, prompt: list[int], max_tokens: int) -> str:
    """Why a new sequence cannot start now, in the manager's own words where it has them.

    NOTE: a contiguous manager explains a refusal when it places the range (which hole was
    too short); registering the sequence and freeing it again asks for that explanation and
    leaves the bookkeeping as it was.
    """
    try:
        kv.add_sequence(seq_id, prompt, max_tokens)
    except CacheFullError as error:
        return str(error)
    kv.free(seq_id)
    need = kv.blocks_for(len(prompt))
    return f"its {len(prompt)} prompt tokens need {need} blocks; {kv.num_free_blocks} are free"


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
