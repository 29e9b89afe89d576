"""Shared blocks: forks, copy-on-write, and prefix hits, the block manager's ``ref_cnt > 1``.

A physical block gets a second holder in two ways, and neither copies anything:

    fork        a child sequence (parallel sampling, ``n > 1``) starts with every block of
                its parent, in order: each block's ``ref_cnt`` goes up by one;
    prefix hit  a new prompt adopts the cached blocks of its longest full-block prefix:
                full blocks carry a chained ``block_hash`` of their token ids
                (``kvlab.cache.prefix_cache``), and the pool finds a hash's block (lab 06).

One rule keeps sharing safe, copy-on-write: before a sequence writes into a partly filled
block that another sequence also holds (a fork's last block; prefix hits are full blocks,
never written again), it takes a private copy. ``allocate_slots`` returns the
``(src, dst)`` pairs the storage must copy, so a shared block is never written in place:

    parent:  [ 7 ][ 2 ][ 9: 6 of 16 ]        fork, then the child writes its next token:
    child:   [ 7 ][ 2 ][ 9 -> 4 ]            copy (9, 4); 7 and 2 stay shared (ref_cnt 2)

``BlockSharing`` is a part of ``kvlab.cache.block_manager.BlockManager``, split out so that
the manager's own growth and frees read on their own; it uses the manager's sequences,
pool and counters and is not meant to be used alone.

Not handled: prefix hits on partial blocks (only full blocks are hashed), hash keys beyond
the token ids (vLLM adds a request's LoRA adapter and multi-modal inputs to them).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.cache.block_pool import BlockPool
from kvlab.cache.block_table import BlockTableRows, SequenceBlocks
from kvlab.cache.prefix_cache import hash_full_blocks


class BlockSharing:
    """Fork, copy-on-write and prefix hits, for the ``BlockManager`` that inherits them."""

    # Set by BlockManager.__init__.
    pool: BlockPool
    block_size: int
    enable_prefix_caching: bool
    rows: BlockTableRows
    _seqs: dict[int, SequenceBlocks]
    _num_used_slots: int

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
        hash_full_blocks(
            self.pool, self.block_size, seq.block_table, seq.token_ids, seq.block_hashes
        )
