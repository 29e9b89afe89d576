"""Block tables: one sequence's, and every sequence's as one row of a persistent int32 array.

``SequenceBlocks`` is what the block manager keeps per sequence; its ``block_table`` lists
are the truth. ``BlockTableRows`` mirrors them; the mirror changes only where a
sequence gains or copies a block, so a step's padded ``(num_seqs, max_blocks)`` block
table is one gather instead of one Python list per sequence. With thousands of running
sequences that is the difference between microseconds and milliseconds per step.

    rows:        seq 4 -> row 0: [ 7  2  9  .  . ]   num_tokens[0] = 38
                 seq 9 -> row 1: [ 3  .  .  .  . ]   num_tokens[1] = 5
    gather([0, 1], num_blocks=[3, 1])  ->  [[7 2 9]
                                            [3 0 0]]   (padding is 0, never read)

Not handled: anything but bookkeeping (numpy only, no torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


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
