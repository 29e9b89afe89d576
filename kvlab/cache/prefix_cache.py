"""Prefix caching: find a prompt's longest already-computed prefix, block by block.

A full block's hash is chained with the hash of the block before it, so equal hashes
mean equal *prefixes*, not just equal 16-token windows:

    block_hash[i] = hash((block_hash[i-1], tuple(token_ids of block i)))

    prompt A:  [sys sys sys sys][sys sys sys q_a][q_a ...]
    prompt B:  [sys sys sys sys][sys sys sys q_b][q_b ...]
               h0 equal          h1 differs: B reuses one block, computes the rest

The pool (``kvlab.cache.block_pool``) keeps the hash of every full, computed block, held
or free, until the block is evicted (a free cached block goes after every plain free block,
least recently used first). These two functions are the rest: ``match_prefix`` walks a
new prompt's blocks and stops at the first hash the pool does not know; ``hash_full_blocks``
gives each block a sequence has just filled its chained hash, so later prompts can find
it. Two blocks may carry one hash (two sequences computed the same prefix side by side);
the match takes the copy the pool finds first. As vLLM 0.32.0 (``hash_block_tokens`` in
``vllm/v1/core/kv_cache_utils.py``, ``FullAttentionManager.find_longest_cache_hit`` in
``single_type_kv_cache_manager.py``), but for the hash function:

Not handled: extra hash keys (LoRA adapters, images, a cache salt), partial-block hits.
Not handled: SHA-256 block hashes (vLLM's default ``--prefix-caching-hash-algo sha256``):
kvlab hashes with Python's 64-bit ``hash``, so collisions are unlikely, not impossible.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the pool calls match_prefix; this module only reads the pool
    from kvlab.cache.block_pool import BlockPool

ROOT_HASH = 0
"""The parent hash of a sequence's first block (a fixed int, so hashes repeat across runs)."""


def hash_block_tokens(parent_hash: int, token_ids: Sequence[int]) -> int:
    """The chained hash of one full block: equal only when the whole prefix is equal."""
    return hash((parent_hash, tuple(token_ids)))


def match_prefix(
    pool: BlockPool, block_size: int, token_ids: Sequence[int]
) -> tuple[list[int], list[int]]:
    """The cached blocks of the longest full-block prefix of ``token_ids``, and their hashes.

    NOTE: the match stops one token short of the prompt: the last prompt token is always
    computed, because its logits pick the first output token.
    """
    blocks, hashes = [], []
    parent = ROOT_HASH
    for start in range(0, len(token_ids) - block_size, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size])
        block_id = pool.lookup(parent)
        if block_id is None:
            break
        blocks.append(block_id)
        hashes.append(parent)
    return blocks, hashes


def hash_full_blocks(
    pool: BlockPool,
    block_size: int,
    block_table: list[int],
    token_ids: list[int],
    block_hashes: list[int],
) -> None:
    """Hash and cache every full block of a sequence past its last hashed one.

    Args:
        block_table: the sequence's blocks.
        token_ids: its token ids, all known.
        block_hashes: the chained hashes of its leading blocks; extended in place.
    """
    parent = block_hashes[-1] if block_hashes else ROOT_HASH
    for index in range(len(block_hashes), len(token_ids) // block_size):
        parent = hash_block_tokens(parent, token_ids[index * block_size : (index + 1) * block_size])
        block_hashes.append(parent)
        pool.cache(block_table[index], parent)
