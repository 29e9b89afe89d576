"""Swapping: move a preempted sequence's KV blocks to CPU memory, and bring them back.

When the paged cache runs out of blocks, the scheduler must take blocks from a running
sequence. Recompute frees them and computes the tokens again later; swapping copies them
to a pool of CPU blocks first, so later they are copied back instead of recomputed:

    device pool:  [ 7 ][ 2 ][ 9 ]      swap_out      CPU pool:  [ 0 ][ 1 ][ 2 ]
                   seq 4's blocks    ------------>               seq 4's copy
                                     <------------
    device pool:  [ 3 ][ 2 ][ 5 ]      swap_in       (new blocks; a block still in the
                                                      prefix cache is adopted, not copied)

The copy back is the seed article's "Prefetch Engine": the scheduler starts it one step
*before* the sequence runs again (``kvlab.engine.scheduler``), so on a GPU it overlaps with the
step that is computing meanwhile: the copy runs on a side CUDA stream from pinned memory
(``non_blocking=True``), and the next forward waits for it on the GPU (``wait``), never on
the CPU. On a CPU-only machine the copies are plain tensor copies.

Not handled: the contiguous cache (a reservation cannot be swapped block by block), disk
offload, swapping a prefix shared by several sequences only once (each sequence swaps its
own copy of every block it holds).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlab.cache.paged import PagedKVCache


@dataclass
class _Swapped:
    cpu_blocks: list[int]
    num_tokens: int
    resident: bool = False  # copied back to device blocks already (prefetched)


class SwapSpace:
    """A pool of ``num_cpu_blocks`` CPU blocks shaped like ``cache``'s blocks.

    Args:
        cache: the device cache whose blocks are swapped.
        num_cpu_blocks: blocks of CPU memory to keep, >= 1.
    """

    def __init__(self, cache: PagedKVCache, num_cpu_blocks: int) -> None:
        if not isinstance(cache, PagedKVCache):  # a contiguous range is not cut into blocks
            raise ValueError(
                f"swapping needs a PagedKVCache, got {type(cache).__name__}: use "
                "preemption_mode='recompute' with a contiguous cache"
            )
        if not isinstance(num_cpu_blocks, int) or num_cpu_blocks <= 0:
            raise ValueError(
                f"num_cpu_blocks={num_cpu_blocks!r}: the swap space must hold at least one "
                f"block ({cache.block_size * cache.bytes_per_slot} bytes)"
            )
        self.cache = cache
        self.num_cpu_blocks = num_cpu_blocks
        on_cuda = cache.device.type == "cuda"
        shape = (2, num_cpu_blocks, *cache.kv_caches[0].shape[2:])
        self.cpu_kv = [
            torch.empty(shape, dtype=kv.dtype, pin_memory=on_cuda) for kv in cache.kv_caches
        ]  # per layer (2, num_cpu_blocks, block_size, num_kv_heads, head_dim)
        self._free = list(range(num_cpu_blocks - 1, -1, -1))  # a stack: pop() gives block 0
        self._swapped: dict[int, _Swapped] = {}
        self._stream = torch.cuda.Stream(cache.device) if on_cuda else None

    @classmethod
    def from_bytes(cls, cache: PagedKVCache, swap_space_bytes: int) -> SwapSpace:
        """As many CPU blocks as ``swap_space_bytes`` hold."""
        block_bytes = cache.block_size * cache.bytes_per_slot
        if not isinstance(swap_space_bytes, int) or swap_space_bytes < block_bytes:
            raise ValueError(
                f"swap_space_bytes={swap_space_bytes!r} holds no KV block: use an int >= "
                f"{block_bytes} (one block of {cache.block_size} tokens)"
            )
        return cls(cache, swap_space_bytes // block_bytes)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._swapped

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.cache.block_size)

    def can_swap_out(self, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) <= len(self._free)

    def is_resident(self, seq_id: int) -> bool:
        """Its blocks are back on the device (prefetched), ready to run."""
        return self._swapped[seq_id].resident

    def swap_out(self, seq_id: int, num_tokens: int) -> None:
        """Copy the blocks of ``seq_id``'s first ``num_tokens`` tokens to CPU; free them.

        The copy is synchronous: once it returns, the device blocks may be reused.
        """
        if not self.can_swap_out(num_tokens):
            raise RuntimeError(
                f"seq {seq_id} needs {self.blocks_for(num_tokens)} CPU blocks, "
                f"{len(self._free)} are free: check can_swap_out first"
            )
        num = self.blocks_for(num_tokens)
        device_blocks = torch.tensor(self.cache.block_table(seq_id)[:num], dtype=torch.long)
        cpu_blocks = [self._free.pop() for _ in range(num)]
        cpu_index = torch.tensor(cpu_blocks, dtype=torch.long)
        device_index = device_blocks.to(self.cache.device)
        for kv, cpu_kv in zip(self.cache.kv_caches, self.cpu_kv, strict=True):
            cpu_kv[:, cpu_index] = kv[:, device_index].cpu()
        self.cache.free(seq_id)
        self._swapped[seq_id] = _Swapped(cpu_blocks, num_tokens)

    def swap_in(self, seq_id: int, token_ids: list[int]) -> int:
        """Give ``seq_id`` device blocks again and start copying its K/V back.

        Blocks of its prefix that are still in the prefix cache are adopted, not copied.
        Call ``wait`` before a forward step reads them.

        Args:
            token_ids: the sequence's first ``num_tokens`` token ids (its swapped tokens).

        Returns:
            blocks copied from the CPU.

        Raises:
            CacheFullError: not enough free device blocks; nothing changes.
        """
        entry = self._swapped[seq_id]
        if entry.resident:
            return 0
        if len(token_ids) != entry.num_tokens:
            raise ValueError(
                f"seq {seq_id} swapped {entry.num_tokens} tokens, got {len(token_ids)} ids"
            )
        num_hit = self.cache.add_request(seq_id, token_ids)
        try:
            self.cache.allocate_slots(seq_id, entry.num_tokens - num_hit, token_ids[num_hit:])
        except Exception:
            self.cache.free(seq_id)
            raise
        first = num_hit // self.cache.block_size
        device_blocks = self.cache.block_table(seq_id)[first:]
        self._copy_in(entry.cpu_blocks[first:], device_blocks)
        entry.resident = True
        return len(device_blocks)

    def undo_swap_in(self, seq_id: int) -> None:
        """Drop the device copy of a prefetched sequence (its CPU copy stays)."""
        entry = self._swapped[seq_id]
        if entry.resident:
            self.wait()
            self.cache.free(seq_id)
            entry.resident = False

    def release(self, seq_id: int) -> None:
        """Forget ``seq_id``'s CPU copy (it runs again, or it was aborted)."""
        entry = self._swapped.pop(seq_id)
        if self._stream is not None:
            # A copy out of these pinned blocks may still be in flight: finish it before the
            # blocks can be overwritten by the next swap_out.
            self._stream.synchronize()
        self._free.extend(reversed(entry.cpu_blocks))

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Apply copy-on-write copies the scheduler has planned, before blocks leave."""
        self.cache.copy_blocks(copies)

    def wait(self) -> None:
        """Make the device's compute stream wait for every copy started by ``swap_in``."""
        if self._stream is not None:
            torch.cuda.current_stream(self.cache.device).wait_stream(self._stream)

    def _copy_in(self, cpu_blocks: list[int], device_blocks: list[int]) -> None:
        if not cpu_blocks:
            return
        if self._stream is None:
            cpu_index = torch.tensor(cpu_blocks, dtype=torch.long)
            device_index = torch.tensor(device_blocks, dtype=torch.long)
            for kv, cpu_kv in zip(self.cache.kv_caches, self.cpu_kv, strict=True):
                kv[:, device_index] = cpu_kv[:, cpu_index]
            return
        # NOTE: the side stream first waits for everything the compute stream has queued, so
        # the destination blocks (free now) are no longer read by a step still in flight.
        self._stream.wait_stream(torch.cuda.current_stream(self.cache.device))
        with torch.cuda.stream(self._stream):
            for kv, cpu_kv in zip(self.cache.kv_caches, self.cpu_kv, strict=True):
                for src, dst in zip(cpu_blocks, device_blocks, strict=True):
                    kv[0, dst].copy_(cpu_kv[0, src], non_blocking=True)
                    kv[1, dst].copy_(cpu_kv[1, src], non_blocking=True)
