"""kvlab.measure.kernel_viz lists what the decode kernel really reads.

The oracle is the kernel itself: a block filled with NaN turns exactly the outputs of the
programs that read it into NaN. Without CUDA the kernel runs in Triton's interpreter, so
the cache is tiny.
"""

from __future__ import annotations

import pytest
import torch
from kvlab.kernels import paged_decode_attention

from kvlab.env import default_device
from kvlab.measure.kernel_viz import decode_block_reads, split_token_range

DEVICE = default_device()

# Shuffled: sequence 0 owns blocks 6, 1, 9 (10 tokens), sequence 1 owns 4, 0 (5 tokens);
# blocks 2, 3, 5, 7, 8 belong to nobody; -1 entries are never read.
BLOCK_TABLE = torch.tensor([[6, 1, 9], [4, 0, -1]], dtype=torch.int32)
SEQ_LENS = torch.tensor([10, 5], dtype=torch.int32)
BLOCK_SIZE, NUM_BLOCKS = 4, 10


def test_each_program_reads_its_sequence_blocks_in_logical_order():
    reads = decode_block_reads(BLOCK_TABLE, SEQ_LENS, BLOCK_SIZE, num_kv_heads=2)
    grid = [(r.seq, r.kv_head, r.split) for r in reads]
    assert grid == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    assert [r.block_ids for r in reads] == [(6, 1, 9), (6, 1, 9), (4, 0), (4, 0)]
    assert all(r.first_logical == 0 for r in reads)


@pytest.mark.parametrize("seq_len", [1, 40, 64, 65, 150, 1000])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7])
def test_splits_cover_the_context_once_in_whole_tiles(seq_len, num_splits):
    ranges = [split_token_range(seq_len, s, num_splits, tile_n=64) for s in range(num_splits)]
    covered = [t for start, end in ranges for t in range(start, end)]
    assert covered == list(range(seq_len))
    assert all(start % 64 == 0 for start, end in ranges if end > start)


def test_short_context_leaves_later_splits_empty():
    reads = decode_block_reads(
        torch.tensor([[3, 5, 1]], dtype=torch.int32),
        torch.tensor([40], dtype=torch.int32),
        block_size=16,
        num_kv_heads=1,
        num_splits=3,
    )
    assert [r.block_ids for r in reads] == [(3, 5, 1), (), ()]


def test_split_reads_start_at_their_logical_block():
    # 150 tokens in 16-token blocks, 3 splits of one 64-token tile: blocks 0-3, 4-7, 8-9.
    table = torch.arange(10, dtype=torch.int32)[None].flip(1)  # physical 9, 8, ..., 0
    reads = decode_block_reads(table, torch.tensor([150]), 16, num_kv_heads=1, num_splits=3)
    assert [r.first_logical for r in reads] == [0, 4, 8]
    assert [r.block_ids for r in reads] == [(9, 8, 7, 6), (5, 4, 3, 2), (1, 0)]


def test_poisoned_block_breaks_exactly_its_readers():
    num_kv_heads, group, head_dim = 2, 2, 16
    gen = torch.Generator().manual_seed(0)
    kv_cache = torch.randn((2, NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, head_dim), generator=gen)
    query = torch.randn((2, num_kv_heads * group, head_dim), generator=gen)
    kv_cache, query = kv_cache.to(DEVICE), query.to(DEVICE)
    block_table, seq_lens = BLOCK_TABLE.to(DEVICE), SEQ_LENS.to(DEVICE)
    reads = decode_block_reads(block_table, seq_lens, BLOCK_SIZE, num_kv_heads)
    for block in range(NUM_BLOCKS):
        poisoned = kv_cache.clone()
        poisoned[:, block] = float("nan")
        out = paged_decode_attention(query, poisoned, block_table, seq_lens)
        broken = out.isnan().any(dim=-1).nonzero().tolist()
        observed = {(seq, head // group) for seq, head in broken}
        assert observed == {(r.seq, r.kv_head) for r in reads if block in r.block_ids}, block
