"""The paged-attention kernels in plain torch: slow, short, and the oracle for the Triton ones.

Each function gathers a sequence's keys and values out of the paged cache into ordinary
contiguous tensors (one ``kv_cache[0, blocks]`` index per sequence) and then runs textbook
attention in float32. Reading this file first makes the kernels easy: they compute the same
thing without ever building the contiguous copy.

Not handled: anything fast. Python loops over sequences; the gathers copy every block.
"""

from __future__ import annotations

import math

import torch


def write_kv_ref(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write each new token's key and value into its slot of the cache, in place.

    Args:
        key, value: (num_tokens, num_kv_heads, head_dim) the step's new keys and values.
        kv_cache: (2, num_blocks, block_size, num_kv_heads, head_dim).
        slot_mapping: (num_tokens,) int64, slot = block_id * block_size + offset_in_block.
            A negative slot (vLLM uses -1 for padding tokens) is skipped.
    """
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    # Viewing blocks x offsets as one axis of slots turns the scatter into plain indexing.
    slots = kv_cache.view(2, num_blocks * block_size, num_kv_heads, head_dim)
    keep = slot_mapping >= 0
    slots[0, slot_mapping[keep]] = key[keep].to(kv_cache.dtype)
    slots[1, slot_mapping[keep]] = value[keep].to(kv_cache.dtype)


def gather_kv(
    kv_cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's keys and values, contiguous: two (seq_len, num_kv_heads, head_dim)."""
    block_size = kv_cache.shape[2]
    num_used = math.ceil(seq_len / block_size)
    blocks = block_table_row[:num_used].long()
    keys = kv_cache[0, blocks].flatten(0, 1)[:seq_len]  # (num_used * block_size, kvh, d) -> cut
    values = kv_cache[1, blocks].flatten(0, 1)[:seq_len]
    return keys, values


def _attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, causal: bool
) -> torch.Tensor:
    """Float32 attention for one sequence; the query rows are the last rows of the context.

    query (q_len, num_heads, d), keys/values (seq_len, num_kv_heads, d) -> (q_len, num_heads, d)
    """
    q_len, num_heads, _ = query.shape
    seq_len, num_kv_heads, _ = keys.shape
    group = num_heads // num_kv_heads
    # GQA: query head h reads KV head h // group.
    keys = keys.float().repeat_interleave(group, dim=1)  # (seq_len, num_heads, d)
    values = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float(), keys) * scale  # (h, q_len, seq_len)
    if causal:
        # Query row i sits at position seq_len - q_len + i and sees keys up to that position.
        positions = torch.arange(seq_len - q_len, seq_len, device=query.device)
        future = torch.arange(seq_len, device=query.device)[None, :] > positions[:, None]
        scores = scores.masked_fill(future, float("-inf"))
    probs = scores.softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, values)


def paged_decode_attention_ref(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Decode attention: each sequence's one new query token attends to all its seq_len tokens.

    Args:
        query: (num_seqs, num_heads, head_dim).
        kv_cache: (2, num_blocks, block_size, num_kv_heads, head_dim).
        block_table: (num_seqs, max_num_blocks_per_seq) int32.
        seq_lens: (num_seqs,) int32, tokens in each sequence, the new one included.
        scale: softmax scale; None means 1 / sqrt(head_dim).

    Returns:
        (num_seqs, num_heads, head_dim) in query's dtype.
    """
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    out = torch.empty_like(query)
    for i, seq_len in enumerate(seq_lens.tolist()):
        keys, values = gather_kv(kv_cache, block_table[i], seq_len)
        out[i] = _attention(query[i : i + 1], keys, values, scale, causal=False)[0]
    return out


def paged_prefill_attention_ref(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal varlen attention for a step's new tokens, whose K/V are already in the cache.

    Sequence i brings query_len = query_start_loc[i+1] - query_start_loc[i] new tokens, the
    last query_len of its seq_len tokens::

        |------ context (cached earlier) ------|====== new (query rows) ======|
        0                      seq_len - query_len                      seq_len

    Args:
        query: (num_tokens, num_heads, head_dim), all sequences' new tokens packed.
        kv_cache, block_table, seq_lens: as in ``paged_decode_attention_ref``.
        query_start_loc: (num_seqs + 1,) int32 offsets of each sequence's rows in query.
        scale: softmax scale; None means 1 / sqrt(head_dim).

    Returns:
        (num_tokens, num_heads, head_dim) in query's dtype.
    """
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        rows = slice(starts[i], starts[i + 1])
        keys, values = gather_kv(kv_cache, block_table[i], seq_len)
        out[rows] = _attention(query[rows], keys, values, scale, causal=True).to(query.dtype)
    return out
