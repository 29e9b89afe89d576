"""Block tables: which physical blocks hold each sequence's tokens, in order.

A sequence sees its tokens as one run of logical blocks; its ``block_table`` maps logical
block ``i`` to a physical block of the ``BlockPool`` (the seed article's "page table").
Token ``pos`` lives in slot ``block_table[pos // block_size] * block_size + pos % block_size``:

    logical:      [ tok 0..15 ][ tok 16..31 ][ tok 32..37      ]   block_size = 16
    block_table:  [     7     ][      2     ][       9         ]
    slots:        112..127      32..47        144..149 (+10 free slots in block 9)

``BlockManager`` is the paged implementation of ``kvlab.cache.manager.KVCacheManager``,
the bookkeeping the scheduler talks to; per sequence it keeps a ``SequenceBlocks`` (the
block table, the tokens held, their ids and block hashes). What it does, with no tensor
(the simulator reuses it as it is):

* growth: a sequence takes one more block only when its last block is full, and a decode
  step (one token per sequence) mostly just counts the token;
* sharing: a physical block gets a second holder (``ref_cnt > 1``) in two ways, and
  neither copies anything. A fork's child (parallel sampling, ``n > 1``) starts with
  every block of its parent; a new prompt adopts the cached blocks of its longest
  full-block prefix (prefix caching: full blocks carry a chained ``block_hash`` of their
  token ids, ``kvlab.cache.prefix_cache``). One rule keeps sharing safe, copy-on-write:
  before a sequence writes into a partly filled block another sequence also holds (a
  fork's last block; prefix hits are full blocks, never written again), it takes a
  private copy, and ``allocate_slots`` returns the ``(src, dst)`` pairs the storage must
  copy:

      parent:  [ 7 ][ 2 ][ 9: 6 of 16 ]        fork, then the child writes its next token:
      child:   [ 7 ][ 2 ][ 9 -> 4 ]            copy (9, 4); 7 and 2 stay shared (ref_cnt 2)

* usage counters kept as blocks come and go, and a mirror of every block table as rows of
  one array (``BlockTableRows``, at the end of this file) for building a step's metadata
  fast.

Not handled: the K/V tensors (``kvlab.cache.paged``), swapping blocks to the CPU, sliding
windows, prefix hits on partial blocks (only full blocks are hashed), hash keys beyond the
token ids (vLLM adds a request's LoRA adapter and multi-modal inputs to them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvlab.cache.block_pool import BlockPool, BlockPoolInterface
from kvlab.cache.manager import (
    CacheFullError,
    DecodeAllocation,
    KVCacheManager,
    KVUsage,
    not_held_error,
)
from kvlab.cache.prefix_cache import hash_full_blocks

MAX_BLOCK_SIZE = 256


@dataclass(slots=True)
class SequenceBlocks:
    """What the block manager keeps per sequence.

    Attributes:
        block_table: physical block of each logical block, in order.
        num_tokens: token slots the sequence holds (written, or allocated for this step).
        token_ids: the ids of those tokens while all are known; None once one is not, which
            ends the hash chain (no later block of this sequence can be cached).
        block_hashes: the chained hash of each leading full block with known token ids.
    """

    block_table: list[int] = field(default_factory=list)
    num_tokens: int = 0
    token_ids: list[int] | None = None
    block_hashes: list[int] = field(default_factory=list)


class BlockManager(KVCacheManager):
    """Per-sequence block tables over one ``BlockPool``: grow, fork, copy-on-write, prefix hits.

    Args:
        num_blocks: physical blocks in the pool.
        block_size: token slots per block, 1 to 256.
        enable_prefix_caching: hash full blocks and let new prompts adopt cached ones.
        pool: the blocks to take from, in place of a new ``BlockPool(num_blocks)`` (lab 06's
            build-it passes the learner's); it must hold ``num_blocks`` blocks, all free.

    Attributes:
        rows: every live sequence's block table as a row of one int32 array.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        pool: BlockPoolInterface | None = None,
    ):
        if not isinstance(block_size, int) or not 1 <= block_size <= MAX_BLOCK_SIZE:
            raise ValueError(
                f"block_size must be an int from 1 to {MAX_BLOCK_SIZE}, got {block_size!r}"
            )
        if pool is not None and (pool.num_blocks, pool.num_free_blocks) != (num_blocks,) * 2:
            raise ValueError(
                f"pool has {pool.num_blocks} blocks, {pool.num_free_blocks} free; the manager "
                f"needs num_blocks={num_blocks}, all free"
            )
        self.pool = pool if pool is not None else BlockPool(num_blocks)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.rows = BlockTableRows(block_size)
        self._seqs: dict[int, SequenceBlocks] = {}
        self._num_used_slots = 0  # tokens in held blocks, a shared block counted once

    # ---- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def seq_ids(self) -> list[int]:
        return list(self._seqs)

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of ``seq_id``'s block table."""
        return list(self._seq(seq_id).block_table)

    def num_tokens(self, seq_id: int) -> int:
        return self._seq(seq_id).num_tokens

    def held_slots(self, seq_id: int) -> int:
        return len(self._seq(seq_id).block_table) * self.block_size

    def usage(self) -> KVUsage:
        return KVUsage(
            num_slots=self.num_blocks * self.block_size,
            num_reserved_slots=self.pool.num_held_blocks * self.block_size,
            num_used_slots=self._num_used_slots,
        )

    def block_tables(self, seq_ids: Sequence[int], seq_lens: np.ndarray) -> np.ndarray:
        rows = self.rows.rows(seq_ids)  # (num_seqs,) each sequence's row of the mirror
        held = self.rows.num_tokens[rows]
        if (seq_lens > held).any():
            raise not_held_error(seq_ids, seq_lens, held)
        return self.rows.gather(rows, -(-seq_lens // self.block_size))

    def num_blocks_needed(self, seq_id: int, num_new_tokens: int) -> int:
        """Free blocks ``allocate_slots(seq_id, num_new_tokens)`` would take, copies included."""
        seq = self._seqs.get(seq_id) or SequenceBlocks()
        total_blocks = -(-(seq.num_tokens + num_new_tokens) // self.block_size)
        return total_blocks - len(seq.block_table) + self._needs_copy(seq)

    def slot_mapping(self, seq_id: int, start: int, num: int) -> list[int]:
        """The slot of each of ``seq_id``'s positions ``start .. start + num - 1``."""
        seq = self._seq(seq_id)
        if start < 0 or start + num > seq.num_tokens:
            raise ValueError(
                f"positions {start}..{start + num - 1} of seq {seq_id} are outside the "
                f"{seq.num_tokens} slots it holds"
            )
        table, size = seq.block_table, self.block_size
        return [table[pos // size] * size + pos % size for pos in range(start, start + num)]

    def holders(self) -> dict[int, list[tuple[int, int]]]:
        """For every held block, the ``(seq_id, logical_index)`` pairs that point at it."""
        holders: dict[int, list[tuple[int, int]]] = {}
        for seq_id, seq in self._seqs.items():
            for logical_index, block_id in enumerate(seq.block_table):
                holders.setdefault(block_id, []).append((seq_id, logical_index))
        return holders

    # ---- changes -------------------------------------------------------------------------

    def allocate_slots(
        self, seq_id: int, num_new_tokens: int, token_ids: Sequence[int] | None = None
    ) -> list[tuple[int, int]]:
        """Make room for ``num_new_tokens`` more tokens of ``seq_id`` (registered if new).

        Args:
            seq_id: the sequence.
            num_new_tokens: tokens this step adds, at least 1.
            token_ids: their ids, if known; full blocks with known ids get a ``block_hash``.
                Omit them once and this sequence's later blocks are never cached.

        Returns:
            ``(src, dst)`` block pairs to copy before writing (copy-on-write of a shared
            last block). The copy has replaced ``src`` in this sequence's block table.

        Raises:
            CacheFullError: not enough free blocks; nothing changes.
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be >= 1, got {num_new_tokens}")
        if token_ids is not None and len(token_ids) != num_new_tokens:
            raise ValueError(
                f"token_ids has {len(token_ids)} ids for num_new_tokens={num_new_tokens}"
            )
        seq = self._seqs.get(seq_id)
        num_old = 0 if seq is None else seq.num_tokens
        copies = self._allocate(seq_id, num_new_tokens, token_ids)
        # The blocks from the one holding the last old token on may have changed (that
        # one, by copy-on-write).
        seq = self._seqs[seq_id]
        self.rows.write(seq_id, seq.block_table, max(num_old - 1, 0) // self.block_size)
        self.rows.set_num_tokens(seq_id, seq.num_tokens)
        return copies

    def allocate_decode(
        self, seq_ids: Sequence[int], token_ids: Sequence[int] | None = None
    ) -> DecodeAllocation:
        """One more slot for each sequence, in order (a decode step).

        The same as ``allocate_slots(seq_id, 1, [token_id])`` for each sequence, but most
        sequences only bump ``num_tokens``: their next token still fits in their own last
        block. Only a sequence whose last block is full, or shared (copy-on-write), takes
        the slow path through the free queue.
        """
        if token_ids is not None and len(token_ids) != len(seq_ids):
            raise ValueError(f"token_ids has {len(token_ids)} ids for {len(seq_ids)} seq_ids")
        seqs, ref_cnt, size = self._seqs, self.pool.ref_cnt, self.block_size
        changed: list[tuple[int, int, int]] = []  # (seq_id, logical_index, block_id)
        copies: list[tuple[int, int]] = []
        num_allocated, num_fast = len(seq_ids), 0
        for index, seq_id in enumerate(seq_ids):
            token_id = None if token_ids is None else token_ids[index]
            seq = seqs.get(seq_id)
            # NOTE: the hot path, taken block_size - 1 times out of block_size: the last
            # block has room and nobody else holds it, so no block table changes.
            if seq is not None and seq.num_tokens % size and ref_cnt[seq.block_table[-1]] == 1:
                seq.num_tokens += 1
                num_fast += 1
                known = seq.token_ids
                if known is None:
                    continue
                if token_id is not None and seq.num_tokens % size:
                    known.append(token_id)  # the block is not full yet: nothing to hash
                else:
                    self._record_token_ids(seq, None if token_id is None else (token_id,))
                continue
            try:
                copies += self._allocate(seq_id, 1, None if token_id is None else (token_id,))
            except CacheFullError:
                num_allocated = index
                break
            table = seqs[seq_id].block_table
            changed.append((seq_id, len(table) - 1, table[-1]))
        self._num_used_slots += num_fast  # the slow path counted its own
        self.rows.set_entries(changed)
        self.rows.add_tokens(seq_ids[:num_allocated])
        return DecodeAllocation(num_allocated, copies)

    def free(self, seq_id: int) -> None:
        """Release ``seq_id``'s blocks: a partly filled last block goes to the front of the
        free queue, reused first; cached ones keep their hashes, reusable until evicted."""
        seq = self._seq(seq_id)
        size, ref_cnt = self.block_size, self.pool.ref_cnt
        for logical_index, block_id in enumerate(seq.block_table):
            if ref_cnt[block_id] == 1:  # nobody else holds it: its tokens leave the count
                self._num_used_slots -= min(size, seq.num_tokens - logical_index * size)
        # Tail first: a sequence's last blocks are the least likely to serve another
        # prompt's prefix, so they should be evicted before its first ones (as vLLM 0.32.0's
        # SingleTypeKVCacheManager.free, vllm/v1/core/single_type_kv_cache_manager.py).
        self.pool.free(reversed(seq.block_table))
        del self._seqs[seq_id]
        self.rows.release(seq_id)

    # ---- fork and copy-on-write ---------------------------------------------------------

    def fork(self, parent_seq_id: int, child_seq_id: int) -> list[tuple[int, int]]:
        """Start ``child_seq_id`` sharing every block of its parent: no copy, no new block."""
        parent = self._seq(parent_seq_id)
        if child_seq_id in self._seqs:
            raise ValueError(f"cannot fork into seq {child_seq_id}: it already exists")
        self.pool.share(parent.block_table)
        self._seqs[child_seq_id] = SequenceBlocks(
            block_table=list(parent.block_table),
            num_tokens=parent.num_tokens,
            token_ids=None if parent.token_ids is None else list(parent.token_ids),
            block_hashes=list(parent.block_hashes),
        )
        self.rows.copy(parent_seq_id, child_seq_id)
        return []

    def _needs_copy(self, seq: SequenceBlocks) -> bool:
        """The next token goes into a partly filled last block that another sequence holds."""
        return seq.num_tokens % self.block_size != 0 and self.pool.ref_cnt[seq.block_table[-1]] > 1

    def _copy_last_block(self, seq: SequenceBlocks) -> tuple[int, int]:
        """Give ``seq`` a private block in place of its shared last one: ``(src, dst)``."""
        src = seq.block_table[-1]
        (dst,) = self.pool.allocate(1)
        self.pool.free([src])
        seq.block_table[-1] = dst
        self._num_used_slots += seq.num_tokens % self.block_size  # the copied tokens
        return src, dst

    # ---- prefix hits -------------------------------------------------------------------

    def lookup_prefix(self, token_ids: Sequence[int]) -> list[int]:
        """The cached blocks of the longest full-block prefix of ``token_ids``; changes nothing
        (``BlockPool.match_prefix``)."""
        blocks, _ = self._match_prefix(token_ids)
        return blocks

    def plan_admission(
        self, token_ids: Sequence[int], token_budget: float, max_tokens: int
    ) -> tuple[int, int, int]:
        hits = self.lookup_prefix(token_ids)
        num_computed = len(hits) * self.block_size
        num_new = int(min(len(token_ids) - num_computed, token_budget))
        new_blocks = self.blocks_for(num_computed + num_new) - len(hits)
        revived = sum(1 for b in hits if self.pool.ref_cnt[b] == 0)  # they leave the free queue
        return num_computed, num_new, new_blocks + revived

    def add_sequence(
        self, seq_id: int, token_ids: Sequence[int] = (), max_tokens: int | None = None
    ) -> int:
        """Register a new sequence, adopting the cached blocks of its prompt's prefix.

        ``max_tokens`` is unused: paged memory grows on demand.

        Returns:
            num_computed_tokens: prompt tokens whose K/V are already in the adopted blocks;
            the caller allocates (and computes) only the rest.
        """
        if seq_id in self._seqs:
            raise ValueError(f"seq {seq_id} already exists")
        blocks, hashes = self._match_prefix(token_ids)
        for block_id in blocks:
            if self.pool.ref_cnt[block_id] == 0:
                self._num_used_slots += self.block_size  # a cached, full block comes back
            self.pool.take_cached(block_id)
        num_computed = len(blocks) * self.block_size
        self._seqs[seq_id] = SequenceBlocks(
            block_table=blocks,
            num_tokens=num_computed,
            token_ids=list(token_ids[:num_computed]) if self.enable_prefix_caching else None,
            block_hashes=hashes,
        )
        self.rows.write(seq_id, blocks, 0)
        self.rows.set_num_tokens(seq_id, num_computed)
        return num_computed

    def _match_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        if not self.enable_prefix_caching:
            return [], []
        return self.pool.match_prefix(self.block_size, token_ids)

    def _record_token_ids(self, seq: SequenceBlocks, token_ids: Sequence[int] | None) -> None:
        """Remember the new ids and hash (and cache) every block they complete."""
        if seq.token_ids is None:
            return
        if token_ids is None:
            seq.token_ids = None  # an unknown id ends the chain: no later block is cached
            return
        seq.token_ids.extend(token_ids)
        for index in hash_full_blocks(self.block_size, seq.token_ids, seq.block_hashes):
            self.pool.cache(seq.block_table[index], seq.block_hashes[index])

    # ---- helpers -------------------------------------------------------------------------

    def _allocate(
        self, seq_id: int, num_new_tokens: int, token_ids: Sequence[int] | None
    ) -> list[tuple[int, int]]:
        """``allocate_slots`` without the block-table rows (callers update them)."""
        seq = self._seqs.get(seq_id)
        if seq is None:
            seq = SequenceBlocks(token_ids=[] if self.enable_prefix_caching else None)
        needs_copy = self._needs_copy(seq)
        total_blocks = -(-(seq.num_tokens + num_new_tokens) // self.block_size)
        num_new_blocks = total_blocks - len(seq.block_table)
        if num_new_blocks + needs_copy > self.pool.num_free_blocks:
            raise CacheFullError(
                f"seq {seq_id} needs {num_new_blocks + needs_copy} free blocks for "
                f"{num_new_tokens} new tokens (block_size={self.block_size}), only "
                f"{self.pool.num_free_blocks} of {self.num_blocks} are free"
            )
        copies = [self._copy_last_block(seq)] if needs_copy else []
        if num_new_blocks:
            seq.block_table.extend(self.pool.allocate(num_new_blocks))
        seq.num_tokens += num_new_tokens
        self._num_used_slots += num_new_tokens
        self._seqs[seq_id] = seq
        self._record_token_ids(seq, token_ids)
        return copies

    def _seq(self, seq_id: int) -> SequenceBlocks:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise KeyError(f"unknown seq_id {seq_id}; known: {sorted(self._seqs)}") from None


# ---- every block table as a row of one array ---------------------------------------------
#
# ``SequenceBlocks.block_table`` lists are the truth; ``BlockTableRows`` mirrors them and
# changes only where a sequence gains or copies a block, so a step's padded
# ``(num_seqs, max_blocks)`` block table is one gather instead of one Python list per
# sequence. With thousands of running sequences that is the difference between
# microseconds and milliseconds per step:
#
#     rows:        seq 4 -> row 0: [ 7  2  9  .  . ]   num_tokens[0] = 38
#                  seq 9 -> row 1: [ 3  .  .  .  . ]   num_tokens[1] = 5
#     gather([0, 1], num_blocks=[3, 1])  ->  [[7 2 9]
#                                             [3 0 0]]   (padding is 0, never read)


class BlockTableRows:
    """The rows: one per live sequence. Rows of freed sequences are reused; entries past a
    sequence's last block are stale (``gather`` zeroes them).

    Attributes:
        table: (num_rows, width) int32, grown by doubling when a row or a block is missing.
        num_tokens: (num_rows,) int64, the token slots each row's sequence holds.
    """

    def __init__(self, block_size: int, num_rows: int = 64, width: int = 8) -> None:
        self.block_size = block_size
        self.table = np.zeros((num_rows, width), dtype=np.int32)
        self.num_tokens = np.zeros(num_rows, dtype=np.int64)
        self._row_of: dict[int, int] = {}
        self._free_rows = list(range(num_rows - 1, -1, -1))

    def rows(self, seq_ids: Sequence[int]) -> np.ndarray:
        """(len(seq_ids),) the row of each sequence."""
        try:
            return np.fromiter(map(self._row_of.__getitem__, seq_ids), np.intp, len(seq_ids))
        except KeyError:
            missing = next(s for s in seq_ids if s not in self._row_of)
            raise KeyError(f"unknown seq_id {missing}") from None

    def num_tokens_of(self, seq_id: int) -> int:
        row = self._row_of.get(seq_id)
        return 0 if row is None else int(self.num_tokens[row])

    def write(self, seq_id: int, block_table: list[int], first: int) -> None:
        """Set the row of ``seq_id`` (a new one if needed) from logical block ``first`` on."""
        row = self._row(seq_id)
        if len(block_table) > self.table.shape[1]:
            self._grow(self.table.shape[0], len(block_table))
        self.table[row, first : len(block_table)] = block_table[first:]

    def set_entries(self, entries: list[tuple[int, int, int]]) -> None:
        """Set single entries: ``(seq_id, logical_index, block_id)`` each."""
        if not entries:
            return
        seq_ids, columns, block_ids = zip(*entries, strict=True)
        rows = [self._row(seq_id) for seq_id in seq_ids]
        if max(columns) >= self.table.shape[1]:
            self._grow(self.table.shape[0], max(columns) + 1)
        self.table[rows, columns] = block_ids

    def set_num_tokens(self, seq_id: int, num_tokens: int) -> None:
        self.num_tokens[self._row(seq_id)] = num_tokens

    def add_tokens(self, seq_ids: Sequence[int]) -> None:
        """One more token for each of ``seq_ids`` (a decode step)."""
        np.add.at(self.num_tokens, self.rows(seq_ids), 1)

    def copy(self, parent_seq_id: int, child_seq_id: int) -> None:
        parent = self._row_of[parent_seq_id]
        child = self._row(child_seq_id)
        self.table[child] = self.table[parent]
        self.num_tokens[child] = self.num_tokens[parent]

    def release(self, seq_id: int) -> None:
        self._free_rows.append(self._row_of.pop(seq_id))

    def gather(self, rows: np.ndarray, num_blocks: np.ndarray) -> np.ndarray:
        """(len(rows), max(num_blocks)) int32: each row's first ``num_blocks``, 0-padded."""
        max_blocks = int(num_blocks.max(initial=0))
        table = self.table[rows, :max_blocks]
        table[np.arange(max_blocks) >= num_blocks[:, None]] = 0
        return table

    def _row(self, seq_id: int) -> int:
        row = self._row_of.get(seq_id)
        if row is None:
            if not self._free_rows:
                self._grow(2 * self.table.shape[0], self.table.shape[1])
            row = self._row_of[seq_id] = self._free_rows.pop()
        return row

    def _grow(self, num_rows: int, width: int) -> None:
        old_rows, old_width = self.table.shape
        width = max(width, 2 * old_width) if width > old_width else old_width
        table = np.zeros((num_rows, width), dtype=np.int32)
        table[:old_rows, :old_width] = self.table
        self.table = table
        self.num_tokens = np.concatenate([self.num_tokens, np.zeros(num_rows - old_rows, np.int64)])
        self._free_rows.extend(range(num_rows - 1, old_rows - 1, -1))
