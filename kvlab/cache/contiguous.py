"""A KV cache that gives each request one contiguous range of slots, reserved up front.

One preallocated tensor per layer holds every request's K/V, shape
``(2, num_slots, num_kv_heads, head_dim)`` (index 0: keys, 1: values). A request declares
itself with ``add_request(seq_id, prompt_token_ids, max_tokens)`` before its first
``allocate_slots``: under the ``reservation_policy`` (see ``kvlab.cache.contiguous_arena``)
the cache then reserves its whole range at once, so its tokens can never be scattered.
Reading a sequence back is one slice, no gather: the upside of contiguity. The downside
is the memory reserved for tokens that may never come, and the holes left between ranges.

    layer tensor, K half:   [ seq 3: 0..511 (37 used) ][ hole ][ seq 5: 640..1663 ] ...
    slot of token pos of seq s = start[s] + pos

Not handled: prefix sharing (``add_request`` always returns 0 computed tokens), growing a
range (a request that outgrows its reservation raises ``CacheFullError``), compaction.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvlab.cache.base import BlockInfo, PooledKVCache, StepMetadata
from kvlab.cache.contiguous_arena import ContiguousArena
from kvlab.cache.contiguous_manager import ContiguousManager
from kvlab.env import default_device
from kvlab.memory import KVSpec


def num_slots_for_budget(spec: KVSpec, budget_bytes: int) -> int:
    """Token slots that ``budget_bytes`` of KV memory hold for ``spec``'s model."""
    num_slots = budget_bytes // spec.bytes_per_token
    if num_slots <= 0:
        raise ValueError(
            f"a budget of {budget_bytes} bytes holds no token of {spec.bytes_per_token} bytes"
        )
    return num_slots


class ContiguousKVCache(PooledKVCache):
    """Per-request contiguous reservations in one slot arena per layer.

    Args:
        num_layers, num_kv_heads, head_dim: the model's KV shape.
        num_slots: token slots in the arena (shared by all requests).
        reservation_policy: how much a request reserves: ``"max_model_len"``, ``"pow2"``
            or ``"exact"``.
        max_model_len: the longest sequence; defaults to ``num_slots``.
        dtype, device: of the K/V tensors; device defaults to CUDA when present.
        cell_size: slots per cell in ``block_infos`` (a drawing grid, not an allocation unit).
        arena: the ``ContiguousArena`` that places the ranges (default: kvlab's).
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_slots: int,
        reservation_policy: str = "max_model_len",
        max_model_len: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device | None = None,
        cell_size: int = 16,
        arena=None,
    ) -> None:
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.manager = ContiguousManager(num_slots, reservation_policy, max_model_len, arena)
        if cell_size <= 0:
            raise ValueError(f"cell_size must be >= 1, got {cell_size}")
        self.cell_size = cell_size
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else default_device()
        self.kv_caches = [
            torch.zeros(2, num_slots, num_kv_heads, head_dim, dtype=dtype, device=self.device)
            for _ in range(num_layers)
        ]  # each (2, num_slots, num_kv_heads, head_dim)

    @classmethod
    def from_spec(cls, spec: KVSpec, num_slots: int, **kwargs) -> ContiguousKVCache:
        """A cache shaped like ``spec``'s model (its ``max_model_len`` unless given)."""
        kwargs.setdefault("max_model_len", spec.max_model_len)
        kwargs.setdefault("dtype", torch.float16 if spec.dtype_bytes == 2 else torch.float32)
        return cls(spec.num_layers, spec.num_kv_heads, spec.head_dim, num_slots, **kwargs)

    @property
    def arena(self) -> ContiguousArena:
        """The manager's arena: the ranges and holes the page map draws."""
        return self.manager.arena

    @property
    def reservation_policy(self) -> str:
        return self.manager.reservation_policy

    @property
    def max_model_len(self) -> int:
        return self.manager.max_model_len

    @property
    def num_slots(self) -> int:
        return self.arena.num_slots

    # ---- request life ----------------------------------------------------------------

    def add_request(
        self, seq_id: int, prompt_token_ids: Sequence[int], max_tokens: int | None = None
    ) -> int:
        """Reserve ``seq_id``'s whole range under the policy; call it before ``allocate_slots``.

        Args:
            seq_id: the new request.
            prompt_token_ids: its prompt (only the length matters here).
            max_tokens: output tokens it may generate; "pow2" and "exact" need it.

        Returns:
            num_computed_tokens: always 0 (no prefix caching in a contiguous cache).

        Raises:
            CacheFullError: no hole is long enough; nothing changes.
        """
        return self.manager.add_sequence(seq_id, prompt_token_ids, max_tokens)

    def allocate_slots(
        self, seq_id: int, num_new_tokens: int, token_ids: Sequence[int] | None = None
    ) -> None:
        """Take ``num_new_tokens`` more slots inside ``seq_id``'s range (``token_ids`` unused).

        A ``seq_id`` never declared with ``add_request`` is declared here, its first tokens
        taken as its prompt; only the "max_model_len" policy can size it without ``max_tokens``.

        Raises:
            CacheFullError: no hole fits a new request's range, or an existing range is too
                short; nothing changes.
        """
        self.manager.allocate_slots(seq_id, num_new_tokens, token_ids)

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Start ``child_seq_id`` as a copy of its parent: a new range, every token copied.

        Contiguous ranges cannot share memory, so a fork costs a whole reservation.

        Raises:
            CacheFullError: no hole fits the child's range; nothing changes.
        """
        self.copy_blocks(self.manager.fork(parent_seq_id, child_seq_id))

    # ---- one step --------------------------------------------------------------------

    def read(self, layer: int, meta: StepMetadata, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        # A range's block table row is its slots in order: the first one is where it starts.
        start = int(meta.block_table[index, 0])
        seq_len = int(meta.batch.seq_lens[index])
        kv = self.kv_caches[layer]
        # One slice, no gather: each is a (seq_len, num_kv_heads, head_dim) view.
        return kv[0, start : start + seq_len], kv[1, start : start + seq_len]

    # ---- reports ---------------------------------------------------------------------

    def block_infos(self) -> list[BlockInfo]:
        """The arena cut into cells of ``cell_size`` slots, for the page-map widget.

        A cell is held by every request whose range overlaps it: where two ranges meet
        inside one cell, that cell lists both (its ``ref_cnt`` is 2 without any sharing).
        """
        size = self.cell_size
        num_cells = -(-self.num_slots // size)
        holders: list[list[int]] = [[] for _ in range(num_cells)]
        filled = [0] * num_cells
        first_cell = {}
        for seq_id in self.arena.seq_ids():
            r = self.arena.range_of(seq_id)
            first_cell[seq_id] = r.start // size
            for cell in range(r.start // size, (r.start + r.num_slots - 1) // size + 1):
                holders[cell].append(seq_id)
            for slot in range(r.start, r.start + r.num_tokens):
                filled[slot // size] += 1
        return [
            BlockInfo(
                block_id=cell,
                ref_cnt=len(holders[cell]),
                seq_ids=tuple(holders[cell]),
                logical_index=cell - first_cell[holders[cell][0]] if holders[cell] else None,
                num_filled=filled[cell],
                cached=False,
            )
            for cell in range(num_cells)
        ]
