"""The swap planner: which KV blocks move between the device and CPU memory, and when.

When the paged cache runs out of blocks, the scheduler must take blocks from a running
sequence. Recompute frees them and computes the tokens again later; swapping copies them
to a pool of CPU blocks first, so later they are copied back instead of recomputed:

    device pool:  [ 7 ][ 2 ][ 9 ]      swap out      CPU pool:  [ 0 ][ 1 ][ 2 ]
                   seq 4's blocks    ------------>               seq 4's copy
                                     <------------
    device pool:  [ 3 ][ 2 ][ 5 ]      swap in       (new blocks; a block still in the
                                                      prefix cache is adopted, not copied)

The planner only decides: it owns the CPU pool's bookkeeping (free CPU blocks, who is
parked where), takes and frees device blocks through the scheduler's ``KVCacheManager``,
and returns the ``(src, dst)`` block pairs to copy. The scheduler records them in its
``SchedulerOutput`` (``blocks_to_swap_out``, ``blocks_to_swap_in``,
``blocks_to_prefetch``), and the engine has ``kvlab.cache.swap.SwapSpace`` copy the
tensors before the step runs, as vLLM's scheduler plans swaps that its worker carries out.
No tensor is touched here, so the scheduler stays torch-free.

A sequence copied back before the step that resumes it (the seed article's Prefetch
Engine, ``Scheduler.prefetch``) is *resident*: its device blocks are taken, its CPU copy
is kept until it runs, and a step that needs the blocks first may drop them again.

Not handled: the contiguous cache (a reservation cannot be swapped block by block), disk
offload, swapping a prefix shared by several sequences only once (each sequence swaps its
own copy of every block it holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.cache.manager import KVCacheManager


@dataclass
class _Parked:
    cpu_blocks: list[int]
    num_tokens: int
    resident: bool = False  # its device blocks are taken again (prefetched)


class SwapPlanner:
    """Plans swaps between ``kv``'s device blocks and a pool of ``num_cpu_blocks`` CPU blocks.

    Args:
        kv: the paged KV bookkeeping (``kvlab.cache.BlockManager``).
        num_cpu_blocks: blocks in the CPU pool, >= 1.
    """

    def __init__(self, kv: KVCacheManager, num_cpu_blocks: int) -> None:
        if not hasattr(kv, "block_table"):  # a contiguous range is not cut into blocks
            raise ValueError(
                f"preemption_mode='swap' needs paged KV blocks, got {type(kv).__name__}: use "
                "preemption_mode='recompute' with a contiguous cache"
            )
        is_int = isinstance(num_cpu_blocks, int) and not isinstance(num_cpu_blocks, bool)
        if not is_int or num_cpu_blocks <= 0:
            raise ValueError(
                f"num_cpu_blocks={num_cpu_blocks!r} is not allowed: preemption_mode='swap' "
                "needs a CPU pool to swap to, an int >= 1"
            )
        self.kv = kv
        self.num_cpu_blocks = num_cpu_blocks
        self._free = list(range(num_cpu_blocks - 1, -1, -1))  # a stack: pop() gives block 0
        self._parked: dict[int, _Parked] = {}

    @property
    def num_free_blocks(self) -> int:
        """Free CPU blocks."""
        return len(self._free)

    def can_swap_out(self, num_tokens: int) -> bool:
        return self.kv.blocks_for(num_tokens) <= len(self._free)

    def is_resident(self, seq_id: int) -> bool:
        """Its device blocks are taken again (prefetched), ready to run."""
        return self._parked[seq_id].resident

    def swap_out(
        self, seq_id: int, num_tokens: int, pending_copies: Sequence[tuple[int, int]] = ()
    ) -> list[tuple[int, int]]:
        """Park the blocks of ``seq_id``'s first ``num_tokens`` tokens in CPU blocks and free
        its device blocks.

        Args:
            pending_copies: this step's copy-on-write pairs planned so far. A block of
                ``seq_id`` that is the destination of one is not filled yet: its source
                is copied out instead (the engine copies out before it copies on write).

        Returns:
            ``(device_block, cpu_block)`` pairs to copy before the freed blocks are reused.
        """
        if not self.can_swap_out(num_tokens):
            raise RuntimeError(
                f"seq {seq_id} needs {self.kv.blocks_for(num_tokens)} CPU blocks, "
                f"{len(self._free)} are free: check can_swap_out first"
            )
        filled_from = {dst: src for src, dst in pending_copies}
        device_blocks = self.kv.block_table(seq_id)[: self.kv.blocks_for(num_tokens)]
        cpu_blocks = [self._free.pop() for _ in device_blocks]
        self.kv.free(seq_id)
        self._parked[seq_id] = _Parked(cpu_blocks, num_tokens)
        return [(filled_from.get(b, b), c) for b, c in zip(device_blocks, cpu_blocks, strict=True)]

    def swap_in(self, seq_id: int, token_ids: Sequence[int]) -> list[tuple[int, int]]:
        """Give ``seq_id`` device blocks again; its prefix blocks still in the prefix cache
        are adopted, not copied.

        Args:
            token_ids: the sequence's first ``num_tokens`` token ids (its parked tokens).

        Returns:
            ``(cpu_block, device_block)`` pairs to copy back (none if it is resident).

        Raises:
            CacheFullError: not enough free device blocks; nothing changes.
        """
        parked = self._parked[seq_id]
        if parked.resident:
            return []
        if len(token_ids) != parked.num_tokens:
            raise ValueError(
                f"seq {seq_id} swapped {parked.num_tokens} tokens, got {len(token_ids)} ids"
            )
        kv = self.kv
        num_hit = kv.add_sequence(seq_id, token_ids, 0)
        try:
            copies = kv.allocate_slots(seq_id, parked.num_tokens - num_hit, token_ids[num_hit:])
        except Exception:
            kv.free(seq_id)
            raise
        assert not copies, "a sequence coming back shares no partly filled block"
        first = num_hit // kv.block_size
        parked.resident = True
        return list(zip(parked.cpu_blocks[first:], kv.block_table(seq_id)[first:], strict=True))

    def undo_swap_in(self, seq_id: int) -> None:
        """Free the device blocks of a resident sequence again (its CPU copy stays)."""
        parked = self._parked[seq_id]
        if parked.resident:
            self.kv.free(seq_id)
            parked.resident = False

    def release(self, seq_id: int) -> None:
        """Free ``seq_id``'s CPU blocks (it runs again, or it was aborted).

        The scheduler releases only after every swap out of the same step is planned, so
        a released block is not written before the copy back that reads it has run.
        """
        self._free.extend(reversed(self._parked.pop(seq_id).cpu_blocks))
