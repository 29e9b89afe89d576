"""Swapping's copies: a CPU pool shaped like the device cache's blocks, and the copies.

The scheduler's swap planner (``kvlab.engine.swap_planner``) decides which blocks move;
the engine hands the ``(src, dst)`` pairs of each step to ``SwapSpace`` before the step
runs: ``swap_out`` copies device blocks to CPU blocks, ``swap_in`` copies them back.

A prefetch is the seed article's "Prefetch Engine": the scheduler plans a copy back one
step *before* the sequence runs again (``blocks_to_prefetch``; a plain swap-in is waited
for), so on a GPU it overlaps with the step that is computing meanwhile: the copy runs on
a side CUDA stream from pinned memory (``non_blocking=True``), and the next forward waits
for it on the GPU (``wait``), never on the CPU. On a CPU-only machine the copies are
plain tensor copies.

Not handled: disk offload.
"""

from __future__ import annotations

import torch

from kvlab.cache.paged import PagedKVCache


class SwapSpace:
    """A pool of ``num_cpu_blocks`` CPU blocks shaped like ``cache``'s blocks.

    Args:
        cache: the device cache whose blocks are swapped.
        num_cpu_blocks: blocks of CPU memory to keep, >= 1 (the swap planner, which plans
            every copy, checks it).
    """

    def __init__(self, cache: PagedKVCache, num_cpu_blocks: int) -> None:
        self.cache = cache
        self.num_cpu_blocks = num_cpu_blocks
        on_cuda = cache.device.type == "cuda"
        shape = (2, num_cpu_blocks, *cache.kv_caches[0].shape[2:])
        self.cpu_kv = [
            torch.empty(shape, dtype=kv.dtype, pin_memory=on_cuda) for kv in cache.kv_caches
        ]  # per layer (2, num_cpu_blocks, block_size, num_kv_heads, head_dim)
        self._stream = torch.cuda.Stream(cache.device) if on_cuda else None

    def swap_out(self, moves: list[tuple[int, int]]) -> None:
        """Copy ``(device_block, cpu_block)`` pairs to the CPU; synchronous: once it returns,
        the device blocks may be overwritten."""
        if not moves:
            return
        device_index = torch.tensor([d for d, _ in moves], device=self.cache.device)
        cpu_index = torch.tensor([c for _, c in moves])
        for kv, cpu_kv in zip(self.cache.kv_caches, self.cpu_kv, strict=True):
            cpu_kv[:, cpu_index] = kv[:, device_index].cpu()

    def swap_in(self, moves: list[tuple[int, int]]) -> None:
        """Start copying ``(cpu_block, device_block)`` pairs back; ``wait`` before a forward
        step reads them."""
        if not moves:
            return
        if self._stream is None:
            cpu_index = torch.tensor([c for c, _ in moves])
            device_index = torch.tensor([d for _, d in moves])
            for kv, cpu_kv in zip(self.cache.kv_caches, self.cpu_kv, strict=True):
                kv[:, device_index] = cpu_kv[:, cpu_index]
            return
        # NOTE: the side stream first waits for everything the compute stream has queued, so
        # the destination blocks (free now) are no longer read by a step still in flight.
        self._stream.wait_stream(torch.cuda.current_stream(self.cache.device))
        with torch.cuda.stream(self._stream):
            for kv, cpu_kv in zip(self.cache.kv_caches, self.cpu_kv, strict=True):
                for src, dst in moves:
                    kv[0, dst].copy_(cpu_kv[0, src], non_blocking=True)
                    kv[1, dst].copy_(cpu_kv[1, src], non_blocking=True)

    def wait(self) -> None:
        """Make the device's compute stream wait for every copy started by ``swap_in``."""
        if self._stream is not None:
            torch.cuda.current_stream(self.cache.device).wait_stream(self._stream)
