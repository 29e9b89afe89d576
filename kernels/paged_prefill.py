"""Paged prefill attention in Triton: many new tokens per sequence, causal, varlen.

In this lesson you will learn:

- the varlen ("ragged") batch: all sequences' new tokens are packed into one
  ``(num_tokens, num_heads, head_dim)`` query, and sequence ``i`` owns rows
  ``query_start_loc[i]:query_start_loc[i + 1]`` (no padding to a common length);
- chunked prefill: a sequence may already hold a context in the cache, and its new tokens
  are its last ``query_len`` tokens, so query row ``j`` sits at position
  ``context_len + j`` and may see keys ``0 .. context_len + j`` (causal mask)::

        |------ context_len (cached) ------|===== query_len (new) =====|
        0                                                        seq_len

- how GQA folds into the tile: a program's rows are (query token, head of the group) pairs,
  so one loaded key tile serves every head that shares the KV head;
- that decode is the special case query_len == 1 (``paged_decode_attention`` is this
  kernel's simpler sibling; read it first).

The new tokens' K/V must already be in the cache (``write_kv`` before attention, as vLLM
does), so keys are always read through the ``block_table``, cached or new alike.

Not handled here: sliding windows, ALiBi, soft-capping, FP8 caches, tuning (fixed tiles).
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

# Keys per loop iteration, gathered token by token through the block table (any block_size).
TILE_N = 64
# Rows of a program's query tile: (query token, head of the group) pairs.
TILE_M = 64


@triton.jit
def _paged_prefill_kernel(
    out_ptr,  # (num_tokens, num_heads, head_dim) output
    query_ptr,  # (num_tokens, num_heads, head_dim) new tokens of all sequences, packed
    kv_cache_ptr,  # (2, num_blocks, block_size, num_kv_heads, head_dim): [0] keys, [1] values
    block_table_ptr,  # (num_seqs, max_num_blocks_per_seq) int32 logical -> physical block
    seq_lens_ptr,  # (num_seqs,) int32 tokens per sequence after this step (context + new)
    query_start_loc_ptr,  # (num_seqs + 1,) int32 first query row of each sequence
    scale,  # softmax scale, usually 1 / sqrt(head_dim)
    stride_q_token,  # elements between consecutive tokens in query (and out)
    stride_q_head,  # elements between consecutive heads in query (and out)
    stride_kv_kind,  # elements from a key to its value (kv_cache[0] -> kv_cache[1])
    stride_kv_block,  # elements between consecutive physical blocks
    stride_kv_slot,  # elements between consecutive tokens of a block
    stride_kv_head,  # elements between consecutive KV heads
    stride_bt_seq,  # elements between consecutive block_table rows
    HEAD_DIM: tl.constexpr,  # real head_dim
    HEAD_DIM_PAD: tl.constexpr,  # head_dim rounded up to a power of two >= 16
    GROUP: tl.constexpr,  # query heads per KV head (num_heads // num_kv_heads)
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    TILE_M: tl.constexpr,  # rows per program: TOKENS_PER_TILE query tokens x GROUP heads
    TOKENS_PER_TILE: tl.constexpr,  # query tokens per program (TILE_M // GROUP)
    TILE_N: tl.constexpr,  # keys per loop iteration
    DOT_IN_FP32: tl.constexpr,  # upcast tl.dot operands (bfloat16 under the interpreter)
):
    # Which sequence, which KV head and which tile of the sequence's query tokens.
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_tile = tl.program_id(2)

    # The sequence's rows in the packed query, and how much context precedes them. The grid
    # is sized for the longest query; programs past this sequence's end have nothing to do.
    q_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len
    if q_tile * TOKENS_PER_TILE >= query_len:
        return

    # Row r of the tile is query token r // GROUP with head r % GROUP of this KV head's group,
    # so the heads sharing a KV head sit side by side and share each key tile.
    rows = tl.arange(0, TILE_M)
    q_index = q_tile * TOKENS_PER_TILE + rows // GROUP  # token index within the new tokens
    heads = kv_head * GROUP + rows % GROUP
    row_mask = (rows < TOKENS_PER_TILE * GROUP) & (q_index < query_len)
    q_positions = context_len + q_index  # position of each row's token in its sequence
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < HEAD_DIM

    # Load the query tile: (TILE_M, HEAD_DIM_PAD); padding rows and columns are zeros.
    q_row_offsets = (q_start + q_index).to(tl.int64) * stride_q_token + heads * stride_q_head
    q = tl.load(
        query_ptr + q_row_offsets[:, None] + dims[None, :],
        mask=row_mask[:, None] & dim_mask[None, :],
        other=0.0,
    )

    # Online-softmax state per row: running max m, running sum l, output acc (fp32).
    m_i = tl.full([TILE_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([TILE_M], dtype=tl.float32)
    acc = tl.zeros([TILE_M, HEAD_DIM_PAD], dtype=tl.float32)

    # Causality bounds the loop: no row of this tile sees past its last token's position.
    last_token = tl.minimum((q_tile + 1) * TOKENS_PER_TILE, query_len)
    keys_end = context_len + last_token
    k_head_ptr = kv_cache_ptr + kv_head * stride_kv_head
    v_head_ptr = k_head_ptr + stride_kv_kind

    for tile_start in range(0, keys_end, TILE_N):
        # Gather the tile's keys through the block table (as in the decode kernel).
        tokens = tile_start + tl.arange(0, TILE_N)
        token_mask = tokens < keys_end
        block_ids = tl.load(
            block_table_ptr + seq * stride_bt_seq + tokens // BLOCK_SIZE, mask=token_mask, other=0
        ).to(tl.int64)
        token_offsets = block_ids * stride_kv_block + (tokens % BLOCK_SIZE) * stride_kv_slot
        kv_mask = token_mask[:, None] & dim_mask[None, :]
        k = tl.load(k_head_ptr + token_offsets[:, None] + dims[None, :], mask=kv_mask, other=0.0)

        # Scores (TILE_M, TILE_N) with the causal mask: row sees key t iff t <= its position.
        # NOTE: padding rows get a position too (>= context_len >= 0), so every row sees key 0
        # and no row's max stays -inf (which would turn exp(m - m_new) into NaN).
        scores = dot(q, tl.trans(k), DOT_IN_FP32) * scale
        visible = token_mask[None, :] & (tokens[None, :] <= q_positions[:, None])
        scores = tl.where(visible, scores, float("-inf"))

        # Online softmax update, then add the values weighted by p.
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_head_ptr + token_offsets[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, DOT_IN_FP32)
        m_i = m_new

    # Normalise and store the real rows.
    out = acc / l_i[:, None]
    tl.store(
        out_ptr + q_row_offsets[:, None] + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & dim_mask[None, :],
    )


def paged_prefill_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float | None = None,
    *,
    check_values: bool = True,
) -> torch.Tensor:
    """Causal attention of a step's new tokens (varlen, chunked prefill) over a paged cache.

    Args:
        query: (num_tokens, num_heads, head_dim), float16, bfloat16 or float32; sequence i's
            new tokens are rows query_start_loc[i]:query_start_loc[i + 1].
        kv_cache: (2, num_blocks, block_size, num_kv_heads, head_dim), query's dtype, already
            holding the new tokens' keys and values.
        block_table: (num_seqs, max_num_blocks_per_seq) int32.
        seq_lens: (num_seqs,) int32, tokens per sequence after this step (context + new).
        query_start_loc: (num_seqs + 1,) int32, starts at 0, ends at num_tokens, and each
            query_len lies in [1, seq_len].
        scale: softmax scale; None means 1 / sqrt(head_dim).
        check_values: also check the values of the integer inputs (lengths, offsets, block ids),
            which copies them to the host and waits for the device (finding the
            longest query for the grid waits once anyway). Shapes, dtypes and
            devices are always checked; an engine whose metadata is known good passes False.

    Returns:
        (num_tokens, num_heads, head_dim) in query's dtype.
    """
    max_query_len = _check_prefill_inputs(
        query, kv_cache, block_table, seq_lens, query_start_loc, scale, check_values
    )
    scale = default_scale(query.shape[-1], scale)
    query = query.contiguous()  # a no-op unless query is a strided view (of a fused QKV, say)
    num_tokens, num_heads, head_dim = query.shape
    num_seqs, num_kv_heads = seq_lens.shape[0], kv_cache.shape[3]
    group = num_heads // num_kv_heads
    tile_m = max(TILE_M, padded(group))
    tokens_per_tile = tile_m // group

    # out and the contiguous query share strides, so one stride pair serves both.
    out = torch.empty_like(query)
    if num_tokens == 0:
        return out
    grid = (num_seqs, num_kv_heads, triton.cdiv(max_query_len, tokens_per_tile))
    _paged_prefill_kernel[grid](
        out,
        query,
        kv_cache,
        block_table,
        seq_lens,
        query_start_loc,
        scale,
        query.stride(0),
        query.stride(1),
        *kv_cache.stride()[:4],
        block_table.stride(0),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=padded(head_dim, MIN_DOT_SIZE),
        GROUP=group,
        BLOCK_SIZE=kv_cache.shape[2],
        TILE_M=tile_m,
        TOKENS_PER_TILE=tokens_per_tile,
        TILE_N=TILE_N,
        DOT_IN_FP32=dot_in_fp32(query.dtype),
    )
    return out


def _check_prefill_inputs(
    query, kv_cache, block_table, seq_lens, query_start_loc, scale, check_values
) -> int:
    """Check every input; return the longest query_len (the grid needs it)."""
    check = InputChecker("paged_prefill_attention")
    check.tensor("query", query, 3, SUPPORTED_DTYPES)
    check.kv_cache(kv_cache)
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads, cache_head_dim = kv_cache.shape[3], kv_cache.shape[4]
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
    check.tensor("seq_lens", seq_lens, 1, (torch.int32,))
    num_seqs = seq_lens.shape[0]
    check.tensor("block_table", block_table, 2, (torch.int32,))
    check.size("block_table", block_table, 0, num_seqs, "one row per sequence in seq_lens")
    check.tensor("query_start_loc", query_start_loc, 1, (torch.int32,))
    check.size("query_start_loc", query_start_loc, 0, num_seqs + 1, "num_seqs + 1 offsets")
    check.scale(scale)
    check.same_device(
        query=query,
        kv_cache=kv_cache,
        block_table=block_table,
        seq_lens=seq_lens,
        query_start_loc=query_start_loc,
    )
    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    if not check_values:
        return int(query_lens.max()) if num_seqs else 0
    starts = query_start_loc.tolist()
    if starts[0] != 0 or starts[-1] != num_tokens:
        check.fail(
            f"query_start_loc must start at 0 and end at num_tokens = {num_tokens}, "
            f"got {starts[0]} ... {starts[-1]}"
        )
    bad = (query_lens < 1) | (query_lens > seq_lens)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        check.fail(
            f"each query_len (query_start_loc[i+1] - query_start_loc[i]) must lie in "
            f"[1, seq_lens[i]]; sequence {i} has query_len {int(query_lens[i])} and "
            f"seq_len {int(seq_lens[i])}"
        )
    check.seq_lens_and_block_table(seq_lens, block_table, kv_cache)
    return int(query_lens.max()) if num_seqs else 0
