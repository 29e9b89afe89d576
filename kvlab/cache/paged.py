"""A paged KV cache: fixed-size blocks from one shared pool, found through a block table.

Per layer one tensor ``(2, num_blocks, block_size, num_kv_heads, head_dim)`` holds the
keys (index 0) and values (index 1) of every block; this is vLLM's layout, and a paged
attention kernel reads it through ``block_table``. A sequence takes a new block only when
its last one is full, so at most ``block_size - 1`` slots per sequence are ever wasted.
The bookkeeping (block tables, ``ref_cnt``, prefix hashes) is ``kvlab.cache.block_manager``;
this class adds the tensors and copies K/V when a block is copied on write.

Each step ``begin_step`` hands the runner a ``StepMetadata`` (``kvlab.cache.base``) with
the batch's ``block_table`` and ``slot_mapping`` (page = block, page table = block table).

Three features on top of plain paging:

* ``fork(parent_seq_id, child_seq_id)``: the child shares every block (parallel sampling).
  The first write into a shared, partly filled block copies it first (copy-on-write,
  inside ``allocate_slots``), so a shared block is never written in place.
* prefix caching (``enable_prefix_caching=True``): ``add_request(seq_id, prompt_token_ids)``
  adopts the cached full blocks of the prompt's longest matching prefix and returns how
  many tokens are already computed; the caller then allocates only the rest.
* block hashes: pass the ids of the tokens you allocate as ``allocate_slots(seq_id, n,
  token_ids=...)``; every block they complete gets a chained ``block_hash`` and stays
  findable after its sequence is freed, until evicted. A call without ``token_ids``
  ends the hash chain of that sequence (its later blocks are never cached).

Two things keep a step's CPU cost low with thousands of running sequences:

* ``allocate_decode(seq_ids, token_ids)`` gives every sequence of a decode step its one
  new slot in one call; only a sequence whose last block is full (or shared) touches the
  block manager's free queue, the others just count one more token.
* every sequence's block table is also one row of a persistent int32 array, rewritten
  only where a sequence gains or copies a block (the block manager's ``BlockTableRows``);
  ``begin_step`` gathers the batch's rows and computes ``slot_mapping`` with array ops,
  with no Python loop over tokens.

Not handled: swapping blocks to CPU memory, partial-block prefix hits, sliding windows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvlab.cache.base import BlockInfo, PooledKVCache, StepMetadata
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.manager import KVCacheManager
from kvlab.env import default_device
from kvlab.memory import KVSpec


def num_blocks_for_budget(spec: KVSpec, budget_bytes: int, block_size: int = 16) -> int:
    """Blocks of ``block_size`` tokens that ``budget_bytes`` of KV memory hold for ``spec``."""
    num_blocks = budget_bytes // (spec.bytes_per_token * block_size)
    if num_blocks <= 0:
        raise ValueError(
            f"a budget of {budget_bytes} bytes holds no block of {block_size} tokens "
            f"({spec.bytes_per_token * block_size} bytes)"
        )
    return num_blocks


class PagedKVCache(PooledKVCache):
    """Blocks of ``block_size`` token slots from one pool, shared through ``ref_cnt``.

    Args:
        num_layers, num_kv_heads, head_dim: the model's KV shape.
        num_blocks: blocks in the pool.
        block_size: token slots per block, 1 to 256.
        dtype, device: of the K/V tensors; device defaults to CUDA when present.
        enable_prefix_caching: hash full blocks and let new prompts adopt cached ones.
        manager: bookkeeping to use in place of a ``BlockManager`` (lab 03's build-it runs
            a learner's this way); it must have this ``num_blocks`` and ``block_size``.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device | None = None,
        enable_prefix_caching: bool = True,
        manager: KVCacheManager | None = None,
    ) -> None:
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        if manager is None:
            manager = BlockManager(num_blocks, block_size, enable_prefix_caching)
        elif (manager.num_blocks, manager.block_size) != (num_blocks, block_size):
            raise ValueError(
                f"manager has num_blocks={manager.num_blocks}, block_size="
                f"{manager.block_size}; the cache was asked for {num_blocks} and {block_size}"
            )
        self.manager = manager
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else default_device()
        shape = (2, num_blocks, block_size, num_kv_heads, head_dim)
        self.kv_caches = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]

    @classmethod
    def from_spec(cls, spec: KVSpec, num_blocks: int, **kwargs) -> PagedKVCache:
        """A cache shaped like ``spec``'s model."""
        kwargs.setdefault("dtype", torch.float16 if spec.dtype_bytes == 2 else torch.float32)
        return cls(spec.num_layers, spec.num_kv_heads, spec.head_dim, num_blocks, **kwargs)

    @property
    def block_size(self) -> int:
        return self.manager.block_size

    @property
    def num_blocks(self) -> int:
        return self.manager.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.manager.num_free_blocks

    def block_table(self, seq_id: int) -> list[int]:
        return self.manager.block_table(seq_id)

    # ---- request life ----------------------------------------------------------------

    def add_request(
        self, seq_id: int, prompt_token_ids: Sequence[int], max_tokens: int | None = None
    ) -> int:
        """Register ``seq_id`` and adopt the cached blocks of its prompt's prefix.

        Optional: ``allocate_slots`` on an unknown ``seq_id`` registers it without a
        prefix lookup. ``max_tokens`` is unused (paged memory grows on demand).

        Returns:
            num_computed_tokens: prompt tokens already in the cache (a multiple of
            ``block_size``, below the prompt length); allocate only the rest.
        """
        return self.manager.add_sequence(seq_id, _int_list(prompt_token_ids))

    def allocate_slots(
        self, seq_id: int, num_new_tokens: int, token_ids: Sequence[int] | None = None
    ) -> None:
        """Make room for ``num_new_tokens`` more tokens; copy a shared last block first.

        Args:
            token_ids: ids of those tokens, so the blocks they complete get a block_hash.

        Raises:
            CacheFullError: not enough free blocks; nothing changes.
        """
        ids = None if token_ids is None else _int_list(token_ids)
        self.copy_blocks(self.manager.allocate_slots(seq_id, num_new_tokens, ids))

    def allocate_decode(
        self, seq_ids: Sequence[int], token_ids: Sequence[int] | None = None
    ) -> int:
        """Make room for one new token of each sequence (a decode step), in order.

        The same as ``allocate_slots(seq_id, 1, token_ids=[token_id])`` for each, in one
        call: only sequences whose last block is full or shared touch the free queue.

        Args:
            seq_ids: the sequences.
            token_ids: the new token of each, so the blocks they complete get a block_hash.

        Returns:
            num_allocated: how many leading sequences got their slot; ``len(seq_ids)``
            unless the pool ran out, and then ``seq_ids[num_allocated]`` and the ones after
            it are unchanged (the caller preempts, then retries them).
        """
        ids = None if token_ids is None else _int_list(token_ids)
        result = self.manager.allocate_decode(seq_ids, ids)
        self.copy_blocks(result.copies)
        return result.num_allocated

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Start ``child_seq_id`` sharing all of its parent's blocks (no copy, no new block)."""
        self.copy_blocks(self.manager.fork(parent_seq_id, child_seq_id))

    # ---- one step ----------------------------------------------------------------

    def read(self, layer: int, meta: StepMetadata, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        seq_len = int(meta.batch.seq_lens[index])
        blocks = meta.block_table[index, : -(-seq_len // self.block_size)].long()
        kv = self.kv_caches[layer]
        # Gather the sequence's blocks in logical order, then drop the unfilled tail.
        keys = kv[0, blocks].flatten(0, 1)[:seq_len]  # (seq_len, num_kv_heads, head_dim)
        values = kv[1, blocks].flatten(0, 1)[:seq_len]
        return keys, values

    # ---- reports ---------------------------------------------------------------------

    def block_infos(self) -> list[BlockInfo]:
        """Every physical block: holders, fill, and whether it can serve a prefix hit."""
        pool = self.manager.pool
        holders = self.manager.holders()
        filled = self._filled_per_block()
        infos = []
        for block_id in range(self.num_blocks):
            held_by = holders.get(block_id, [])
            cached = pool.block_hash[block_id] is not None
            infos.append(
                BlockInfo(
                    block_id=block_id,
                    ref_cnt=pool.ref_cnt[block_id],
                    seq_ids=tuple(seq_id for seq_id, _ in held_by),
                    logical_index=held_by[0][1] if held_by else None,
                    num_filled=filled.get(block_id, self.block_size if cached else 0),
                    cached=cached,
                )
            )
        return infos

    def _filled_per_block(self) -> dict[int, int]:
        """Tokens in each held block (a shared block counts once)."""
        filled: dict[int, int] = {}
        for block_id, held_by in self.manager.holders().items():
            seq_id, logical_index = held_by[0]
            in_block = self.manager.num_tokens(seq_id) - logical_index * self.block_size
            filled[block_id] = min(self.block_size, in_block)
        return filled


def _int_list(token_ids: Sequence[int] | torch.Tensor) -> list[int]:
    """Token ids as plain ints (a tensor element would hash by identity, not value)."""
    if isinstance(token_ids, torch.Tensor):
        return token_ids.tolist()
    return list(map(int, token_ids))
