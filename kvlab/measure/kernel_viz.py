"""Which physical blocks each program of the paged decode kernel reads, in reading order.

``kvlab.kernels.paged_decode_attention`` launches a grid of programs, one per
(sequence, KV head, split). A program walks its chunk of the context and finds every
token's physical block through its sequence's row of the ``block_table``, so the blocks it
reads are that row, cut to the chunk. For a small shuffled block table:

    block_table[0] = [6, 1, 9]     program (seq 0, KV head h) reads blocks 6, 1, 9
    block_table[1] = [4, 0]        program (seq 1, KV head h) reads blocks 4, 0
                                   blocks 2, 3, 5, 7, 8 belong to nobody: nobody reads them

``split_token_range`` repeats the kernel's own arithmetic for a split's chunk, and the tests
check the list against the kernel itself (a poisoned block turns exactly its readers' outputs
into NaN). ``kvlab.widgets.kernel_figures`` draws the list for lab 05.

Not handled: the prefill kernel's grid (it adds query tiles), and reads of the query, the
block table or the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlab.kernels.paged_attention import TILE_N


@dataclass(frozen=True)
class ProgramReads:
    """One program of the decode grid and the physical blocks it reads, in reading order.

    Attributes:
        seq, kv_head, split: the program's ids, ``tl.program_id(0)``, ``(1)`` and ``(2)``.
        first_logical: the logical block index of ``block_ids[0]``.
        block_ids: the physical blocks it reads; empty when its split has no tokens.
    """

    seq: int
    kv_head: int
    split: int
    first_logical: int
    block_ids: tuple[int, ...]

    def label(self, num_splits: int) -> str:
        text = f"seq {self.seq} · KV head {self.kv_head}"
        return text if num_splits == 1 else f"{text} · split {self.split}"


def split_token_range(
    seq_len: int, split: int, num_splits: int, tile_n: int = TILE_N
) -> tuple[int, int]:
    """The tokens [start, end) that ``split`` covers, as the kernel computes them.

    Each split gets a whole number of tiles: ceil(ceil(seq_len / num_splits) / tile_n)
    tiles. A split that starts past the end of a short context gets an empty range.
    """
    tokens_per_split = _cdiv(_cdiv(seq_len, num_splits), tile_n) * tile_n
    start = split * tokens_per_split
    end = min(start + tokens_per_split, seq_len)
    return start, max(start, end)


def decode_block_reads(
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    num_kv_heads: int,
    num_splits: int = 1,
    tile_n: int = TILE_N,
) -> list[ProgramReads]:
    """Every program of ``paged_decode_attention``'s grid and the blocks it reads.

    Args:
        block_table: (num_seqs, max_num_blocks_per_seq) logical -> physical block.
        seq_lens: (num_seqs,) tokens in each sequence.
        block_size, num_kv_heads: of the cache the kernel reads.
        num_splits, tile_n: the kernel's split-K setting and tile length.

    Returns:
        One entry per program, in grid order (sequence, then KV head, then split).
    """
    rows, lens = block_table.tolist(), seq_lens.tolist()
    reads = []
    for seq, seq_len in enumerate(lens):
        for kv_head in range(num_kv_heads):
            for split in range(num_splits):
                start, end = split_token_range(seq_len, split, num_splits, tile_n)
                logical = range(start // block_size, _cdiv(end, block_size))
                blocks = tuple(rows[seq][i] for i in logical) if end > start else ()
                reads.append(ProgramReads(seq, kv_head, split, logical.start, blocks))
    return reads


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
