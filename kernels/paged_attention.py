"""Paged decode attention in Triton: reading K and V through a block table.

In this lesson you will learn:

- how an attention kernel finds a token's key when the cache is paged: token ``t`` of a
  sequence lives in physical block ``block_table[seq, t // block_size]`` at offset
  ``t % block_size``, so each tile of keys is a *gather*, not one contiguous load;
- why one program per (sequence, KV head) is the right grid for grouped-query attention
  (GQA): the ``group`` query heads that share a KV head all use each loaded block, so the
  cache is read once instead of ``group`` times;
- the online softmax (the "flash" trick): keep a running max ``m``, a running sum ``l`` and
  an unnormalised output ``acc``, rescale them when a larger score arrives, and never hold
  a whole row of scores;
- split-K, also called flash-decoding: with few sequences there are too few programs to fill
  a GPU, so each sequence's context is cut into ``num_splits`` chunks computed in parallel
  and merged by their log-sum-exp.

Decode means one new query token per sequence; its key and value are already in the cache
(``write_kv`` put them there), so sequence ``i`` attends to all ``seq_lens[i]`` tokens.

    block_table[i] = [7, 2, 9]          block_size = 4, seq_lens[i] = 10
    tokens          0 1 2 3 | 4 5 6 7 | 8 9
    physical block  7       | 2       | 9 (half full: the mask stops at seq_len)

Not handled here: sliding windows, ALiBi, soft-capping, FP8 caches, CUDA graphs, and
performance tuning (no autotuning, fixed tile sizes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from kvlab.kernels._common import (
    MIN_DOT_SIZE,
    SUPPORTED_DTYPES,
    InputChecker,
    default_scale,
    dot,
    dot_in_fp32,
    padded,
)

# Keys processed per loop iteration. Tokens are gathered one by one through the block table,
# so a tile may span several blocks (block_size < TILE_N, down to block_size 1) or part of
# one block (block_size > TILE_N): the tile size does not depend on the block size.
TILE_N = 64


@triton.jit
def _paged_decode_kernel(
    out_ptr,  # (num_seqs, num_heads, head_dim) output, or (num_seqs, num_heads, num_splits,
    #           head_dim) float32 partial outputs when NUM_SPLITS > 1
    lse_ptr,  # (num_seqs, num_heads, num_splits) float32 log-sum-exp of each split's scores
    query_ptr,  # (num_seqs, num_heads, head_dim) the one new query token of each sequence
    kv_cache_ptr,  # (2, num_blocks, block_size, num_kv_heads, head_dim): [0] keys, [1] values
    block_table_ptr,  # (num_seqs, max_num_blocks_per_seq) int32 logical -> physical block
    seq_lens_ptr,  # (num_seqs,) int32 tokens in each sequence, the new one included
    scale,  # softmax scale, usually 1 / sqrt(head_dim)
    stride_q_seq,  # elements between consecutive sequences in query
    stride_q_head,  # elements between consecutive heads in query
    stride_o_seq,  # elements between consecutive sequences in out
    stride_o_head,  # elements between consecutive heads in out
    stride_o_split,  # elements between consecutive splits in out (unused without split-K)
    stride_lse_seq,  # elements between consecutive sequences in lse (unused without split-K)
    stride_lse_head,  # elements between consecutive heads in lse (unused without split-K)
    stride_kv_kind,  # elements from a key to its value (kv_cache[0] -> kv_cache[1])
    stride_kv_block,  # elements between consecutive physical blocks
    stride_kv_slot,  # elements between consecutive tokens of a block
    stride_kv_head,  # elements between consecutive KV heads
    stride_bt_seq,  # elements between consecutive block_table rows
    HEAD_DIM: tl.constexpr,  # real head_dim
    HEAD_DIM_PAD: tl.constexpr,  # head_dim rounded up to a power of two >= 16
    GROUP: tl.constexpr,  # query heads per KV head (num_heads // num_kv_heads)
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two >= 16 (tl.dot's minimum)
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    TILE_N: tl.constexpr,  # keys per loop iteration
    NUM_SPLITS: tl.constexpr,  # chunks each context is cut into (1: no split-K)
    DOT_IN_FP32: tl.constexpr,  # upcast tl.dot operands (bfloat16 under the interpreter)
):
    # Which sequence, which KV head and which chunk of the context this program computes.
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)

    # The chunk of tokens [start, end) of this split, a whole number of tiles long. With
    # NUM_SPLITS == 1 it is the whole context. A split past the end gets an empty chunk.
    tokens_per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), TILE_N) * TILE_N
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)

    # Load the query rows of every head in this KV head's group: a (GROUP_PAD, HEAD_DIM_PAD)
    # tile. Padding rows (beyond GROUP) and columns (beyond HEAD_DIM) are zeros, never stored.
    group_rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + group_rows
    dims = tl.arange(0, HEAD_DIM_PAD)
    row_mask = group_rows < GROUP
    dim_mask = dims < HEAD_DIM
    q = tl.load(
        query_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :],
        mask=row_mask[:, None] & dim_mask[None, :],
        other=0.0,
    )

    # Online-softmax state per query row: running max m, running sum l, output acc (fp32).
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)

    # Keys of this KV head start here; the values sit one stride_kv_kind further.
    k_head_ptr = kv_cache_ptr + kv_head * stride_kv_head
    v_head_ptr = k_head_ptr + stride_kv_kind

    for tile_start in range(start, end, TILE_N):
        # Where the tile's tokens live: look up each token's physical block in the block
        # table, then its offset inside the block. NOTE: int64, because block_id * stride
        # overflows int32 once the cache holds more than 2**31 elements (4 GiB of fp16).
        tokens = tile_start + tl.arange(0, TILE_N)
        token_mask = tokens < end
        block_ids = tl.load(
            block_table_ptr + seq * stride_bt_seq + tokens // BLOCK_SIZE, mask=token_mask, other=0
        ).to(tl.int64)
        token_offsets = block_ids * stride_kv_block + (tokens % BLOCK_SIZE) * stride_kv_slot
        kv_mask = token_mask[:, None] & dim_mask[None, :]

        # Scores of every query row against the tile's keys: (GROUP_PAD, TILE_N), fp32.
        k = tl.load(k_head_ptr + token_offsets[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        scores = dot(q, tl.trans(k), DOT_IN_FP32) * scale
        scores = tl.where(token_mask[None, :], scores, float("-inf"))

        # Online softmax: the new running max, how much the old state shrinks (alpha), and
        # this tile's unnormalised probabilities. Every tile holds >= 1 real token, so the
        # max is finite after the first tile.
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)

        # Add this tile's values, weighted by p, to the rescaled output.
        v = tl.load(v_head_ptr + token_offsets[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, DOT_IN_FP32)
        m_i = m_new

    # Normalise. A split whose chunk was empty has l == 0: store zeros and lse = -inf, which
    # the merge weighs by exp(-inf) = 0.
    has_tokens = l_i > 0
    out = acc / tl.where(has_tokens, l_i, 1.0)[:, None]
    out_ptrs = out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head + dims[None, :]
    out_mask = row_mask[:, None] & dim_mask[None, :]
    if NUM_SPLITS == 1:
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.store(out_ptrs + split * stride_o_split, out, mask=out_mask)
        lse = tl.where(has_tokens, m_i + tl.log(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
        lse_ptrs = lse_ptr + seq * stride_lse_seq + heads * stride_lse_head + split
        tl.store(lse_ptrs, lse, mask=row_mask)


@triton.jit
def _merge_splits_kernel(
    out_ptr,  # (num_seqs, num_heads, head_dim) final output
    partial_ptr,  # (num_seqs, num_heads, num_splits, head_dim) float32, contiguous
    lse_ptr,  # (num_seqs, num_heads, num_splits) float32, contiguous
    stride_o_seq,  # elements between consecutive sequences in out
    stride_o_head,  # elements between consecutive heads in out
    HEAD_DIM: tl.constexpr,  # real head_dim
    HEAD_DIM_PAD: tl.constexpr,  # head_dim rounded up to a power of two
    NUM_SPLITS: tl.constexpr,  # splits to merge
    NUM_SPLITS_PAD: tl.constexpr,  # NUM_SPLITS rounded up to a power of two
):
    # One program merges the splits of one (sequence, query head): row seq * num_heads + head
    # of the contiguous partial and lse tensors.
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = seq * tl.num_programs(1) + head
    splits = tl.arange(0, NUM_SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    split_mask = splits < NUM_SPLITS

    # Each split's weight is its share of the softmax denominator, exp(lse_s) / sum exp(lse),
    # computed relative to the largest lse so nothing overflows. Split 0 always holds tokens.
    lse = tl.load(lse_ptr + row * NUM_SPLITS + splits, mask=split_mask, other=float("-inf"))
    weights = tl.exp(lse - tl.max(lse, axis=0))
    weights = weights / tl.sum(weights, axis=0)

    # The output is the weighted sum of the splits' normalised outputs.
    partial = tl.load(
        partial_ptr + (row * NUM_SPLITS + splits[:, None]) * HEAD_DIM + dims[None, :],
        mask=split_mask[:, None] & (dims < HEAD_DIM)[None, :],
        other=0.0,
    )
    out = tl.sum(partial * weights[:, None], axis=0)
    tl.store(
        out_ptr + seq * stride_o_seq + head * stride_o_head + dims,
        out.to(out_ptr.dtype.element_ty),
        mask=dims < HEAD_DIM,
    )


def paged_decode_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    num_splits: int = 1,
    *,
    check_values: bool = True,
) -> torch.Tensor:
    """Attention of each sequence's one new query token over its paged KV cache.

    Args:
        query: (num_seqs, num_heads, head_dim), float16, bfloat16 or float32.
        kv_cache: (2, num_blocks, block_size, num_kv_heads, head_dim), query's dtype.
        block_table: (num_seqs, max_num_blocks_per_seq) int32.
        seq_lens: (num_seqs,) int32, each in [1, max_num_blocks_per_seq * block_size].
        scale: softmax scale; None means 1 / sqrt(head_dim).
        num_splits: chunks each context is cut into and computed in parallel (split-K,
            flash-decoding); 1 turns it off. Helps when num_seqs * num_kv_heads is small.
        check_values: also check the values of the integer inputs (lengths, block ids),
            which copies them to the host and waits for the device. Shapes, dtypes and
            devices are always checked; an engine whose metadata is known good passes False.

    Returns:
        (num_seqs, num_heads, head_dim) in query's dtype.
    """
    _check_decode_inputs(query, kv_cache, block_table, seq_lens, scale, num_splits, check_values)
    scale = default_scale(query.shape[-1], scale)
    query = query.contiguous() if query.stride(-1) != 1 else query
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    head_dim_pad = padded(head_dim, MIN_DOT_SIZE)

    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    if num_splits == 1:
        partial, lse = out, out  # the kernel writes the final output directly; lse unused
    else:
        partial = query.new_empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32)
        lse = query.new_empty((num_seqs, num_heads, num_splits), dtype=torch.float32)

    grid = (num_seqs, num_kv_heads, num_splits)
    _paged_decode_kernel[grid](
        partial,
        lse,
        query,
        kv_cache,
        block_table,
        seq_lens,
        scale,
        query.stride(0),
        query.stride(1),
        partial.stride(0),
        partial.stride(1),
        partial.stride(2) if num_splits > 1 else 0,
        lse.stride(0),
        lse.stride(1),
        *kv_cache.stride()[:4],
        block_table.stride(0),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        GROUP=group,
        GROUP_PAD=padded(group, MIN_DOT_SIZE),
        BLOCK_SIZE=kv_cache.shape[2],
        TILE_N=TILE_N,
        NUM_SPLITS=num_splits,
        DOT_IN_FP32=dot_in_fp32(query.dtype),
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_seqs, num_heads)](
            out,
            partial,
            lse,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            HEAD_DIM_PAD=padded(head_dim),
            NUM_SPLITS=num_splits,
            NUM_SPLITS_PAD=padded(num_splits),
        )
    return out


def _check_decode_inputs(
    query, kv_cache, block_table, seq_lens, scale, num_splits, check_values
) -> None:
    check = InputChecker("paged_decode_attention")
    check.tensor("query", query, 3, SUPPORTED_DTYPES)
    check.kv_cache(kv_cache)
    num_seqs, num_heads, head_dim = query.shape
    _, _, block_size, num_kv_heads, cache_head_dim = kv_cache.shape
    if kv_cache.dtype != query.dtype:
        check.fail(
            f"kv_cache dtype {kv_cache.dtype} must match query dtype {query.dtype}", TypeError
        )
    if cache_head_dim != head_dim:
        check.fail(f"head_dim of query ({head_dim}) and kv_cache ({cache_head_dim}) differ")
    if num_heads % num_kv_heads != 0:
        check.fail(
            f"num_heads ({num_heads}, query.shape[1]) must be a multiple of num_kv_heads "
            f"({num_kv_heads}, kv_cache.shape[3])"
        )
    check.tensor("block_table", block_table, 2, (torch.int32,))
    check.size("block_table", block_table, 0, num_seqs, "one row per sequence in query")
    check.tensor("seq_lens", seq_lens, 1, (torch.int32,))
    check.size("seq_lens", seq_lens, 0, num_seqs, "one length per sequence in query")
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 1:
        check.fail(f"num_splits must be an int >= 1 (1 = no split-K), got {num_splits!r}")
    check.scale(scale)
    check.same_device(query=query, kv_cache=kv_cache, block_table=block_table, seq_lens=seq_lens)
    if check_values:
        check.seq_lens_and_block_table(seq_lens, block_table, kv_cache)
