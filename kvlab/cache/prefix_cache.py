"""Prefix caching: find a prompt's longest already-computed prefix, block by block.

A full block's hash is chained with the hash of the block before it, so equal hashes
mean equal *prefixes*, not just equal 16-token windows:

    block_hash[i] = hash((block_hash[i-1], tuple(token_ids of block i)))

    prompt A:  [sys sys sys sys][sys sys sys q_a][q_a ...]
    prompt B:  [sys sys sys sys][sys sys sys q_b][q_b ...]
               h0 equal          h1 differs: B reuses one block, computes the rest

``PrefixCache`` maps each hash to the blocks that carry it: every full block, held or
free, from the step that fills it (its tokens are known when its slots are allocated, and
the engine computes them in that step) until the block pool evicts it
(``kvlab.cache.block_pool``; a free cached block goes after every plain free block, least
recently used first). ``match_prefix`` walks a new prompt's blocks and stops at the first
hash it does not know; ``hash_full_blocks`` gives the blocks a sequence has just filled
their chained hashes, for the pool to cache. Two blocks may carry one hash (two sequences
computed the same prefix side by side); the match takes the copy cached first. As vLLM
0.32.0 (``hash_block_tokens`` in ``vllm/v1/core/kv_cache_utils.py``,
``FullAttentionManager.find_longest_cache_hit`` in ``single_type_kv_cache_manager.py``),
but for the hash function.

Not handled: extra hash keys (LoRA adapters, images, a cache salt), partial-block hits.
Not handled: SHA-256 block hashes (vLLM's default ``--prefix-caching-hash-algo sha256``):
kvlab hashes with Python's 64-bit ``hash``, so collisions are unlikely, not impossible.
"""

from __future__ import annotations

from collections.abc import Sequence

ROOT_HASH = 0
"""The parent hash of a sequence's first block (a fixed int, so hashes repeat across runs)."""


def hash_block_tokens(parent_hash: int, token_ids: Sequence[int]) -> int:
    """The chained hash of one full block: equal only when the whole prefix is equal."""
    return hash((parent_hash, tuple(token_ids)))


def hash_full_blocks(block_size: int, token_ids: list[int], block_hashes: list[int]) -> range:
    """Extend ``block_hashes`` (a sequence's chained hashes, one per leading full block)
    to every full block of ``token_ids``; return the indices of the blocks just hashed."""
    first = len(block_hashes)
    parent = block_hashes[-1] if block_hashes else ROOT_HASH
    for index in range(first, len(token_ids) // block_size):
        parent = hash_block_tokens(parent, token_ids[index * block_size : (index + 1) * block_size])
        block_hashes.append(parent)
    return range(first, len(block_hashes))


class PrefixCache:
    """``block_hash -> the blocks that carry it``, the first cached found first."""

    def __init__(self) -> None:
        self._blocks: dict[int, list[int]] = {}

    def lookup(self, block_hash: int) -> int | None:
        """A block whose contents have this hash (the first cached of its copies), or None."""
        blocks = self._blocks.get(block_hash)
        return blocks[0] if blocks else None

    def blocks(self, block_hash: int) -> list[int]:
        """Every block that carries this hash, the one ``lookup`` finds first."""
        return list(self._blocks.get(block_hash, ()))

    def add(self, block_hash: int, block_id: int) -> None:
        self._blocks.setdefault(block_hash, []).append(block_id)

    def remove(self, block_hash: int, block_id: int) -> None:
        copies = self._blocks[block_hash]
        copies.remove(block_id)
        if not copies:
            del self._blocks[block_hash]

    def match_prefix(
        self, block_size: int, token_ids: Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """The cached blocks of the longest full-block prefix of ``token_ids``, and their
        hashes; changes nothing.

        NOTE: the match stops one token short of the prompt: the last prompt token is always
        computed, because its logits pick the first output token.
        """
        blocks, hashes = [], []
        parent = ROOT_HASH
        for start in range(0, len(token_ids) - block_size, block_size):
            parent = hash_block_tokens(parent, token_ids[start : start + block_size])
            block_id = self.lookup(parent)
            if block_id is None:
                break
            blocks.append(block_id)
            hashes.append(parent)
        return blocks, hashes
