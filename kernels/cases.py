"""Inputs the kernels are checked on: random paged caches with shuffled block tables.

A kernel that reads the cache through a block table can look right on a cache whose blocks
are handed out in order (block ``i`` of every sequence at physical block ``i``, or a
contiguous layout), and wrong the moment the pool is fragmented. So every check here uses
a pool whose blocks were handed out in a random order, with spare blocks nobody holds and
block-table entries past each sequence's last block filled with an id no kernel may follow.

    shuffled_paged_cache(seq_lens, block_size, num_kv_heads, head_dim)
        -> kv_cache (2, num_blocks, block_size, num_kv_heads, head_dim), block_table
           (num_seqs, max_blocks + extra_columns) int32, seq_lens (num_seqs,) int32
    random_query(num_seqs, num_heads, head_dim) -> (num_seqs, num_heads, head_dim)

Used by lab 05, its build-it check and ``tests/test_kernels.py``.
"""

from __future__ import annotations

import torch


def shuffled_paged_cache(
    seq_lens: list[int],
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    num_spare: int = 3,
    extra_columns: int = 0,
    unused_entry: int = -1,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random cache whose blocks are handed out in shuffled order, and its block table.

    Args:
        seq_lens: tokens in each sequence.
        num_spare: blocks of the pool that no sequence holds (random data a kernel must
            not read).
        extra_columns: block-table columns past the longest sequence's blocks.
        unused_entry: what the table holds past each sequence's last block.
        seed: seeds the block order and the K/V values.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]  # ceil(seq_len / block_size)
    num_blocks = sum(blocks_per_seq) + num_spare
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_per_seq) + extra_columns
    block_table = torch.full((len(seq_lens), width), unused_entry, dtype=torch.int32)
    for i, n in enumerate(blocks_per_seq):
        block_table[i, :n] = torch.tensor(physical[:n])
        physical = physical[n:]
    kv_cache = torch.randn((2, num_blocks, block_size, num_kv_heads, head_dim), generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return kv_cache.to(device, dtype), block_table.to(device), lens.to(device)


def random_query(
    num_seqs: int,
    num_heads: int,
    head_dim: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 1,
) -> torch.Tensor:
    """(num_seqs, num_heads, head_dim) standard-normal queries, seeded."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((num_seqs, num_heads, head_dim), generator=gen).to(device, dtype)
