"""Lab 05's kernel, built up one idea at a time: three small decode kernels, each runnable.

Lab 05 goes from the simplest decode kernel to kvlab's ``paged_decode_attention`` in
steps, and each step is a kernel of its own, checked against the torch reference:

    contiguous_decode    one sequence, its keys and values in one contiguous tensor; one
                         program per query head; two passes (max, then sum)
    (lab 05, section 3)  the same through the block table: the gather
    gqa_paged_decode     one program per (sequence, KV head): the group of query heads
                         that share a KV head read each block once
    (lab 05, section 4.3) the online softmax: one pass (the learner's build-it)
    split_paged_decode   split-K: each program computes one chunk of the context, one
                         pass; the chunks are merged by their log-sum-exp

kvlab's own kernel (``paged_attention``) is all of them at once, with tiles of TILE_N
tokens gathered token by token and ``tl.dot`` for the scores.

Shapes as in ``kvlab.kernels``; ``head_dim``, ``block_size`` and the group size padded to
a power of two are what ``tl.arange`` accepts. Not handled: float16 accumulation details,
head dims that are not powers of two.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _contiguous_decode_kernel(
    out_ptr,  # (num_heads, head_dim) output
    query_ptr,  # (num_heads, head_dim) the sequence's one new query token
    keys_ptr,  # (seq_len, num_kv_heads, head_dim) contiguous keys
    values_ptr,  # (seq_len, num_kv_heads, head_dim) contiguous values
    seq_len,  # tokens in the sequence
    scale,  # softmax scale
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,  # a power of two
    TILE: tl.constexpr,  # tokens per loop iteration, a power of two
):
    head = tl.program_id(0)  # one program per query head
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(query_ptr + head * HEAD_DIM + dims).to(tl.float32)
    # Token t's key of this KV head sits at (t * NUM_KV_HEADS + kv_head) * HEAD_DIM.
    head_offset = (head // GROUP) * HEAD_DIM

    # Pass 1: the largest score.
    m = tl.full([TILE], float("-inf"), dtype=tl.float32)
    for start in range(0, seq_len, TILE):
        tokens = start + tl.arange(0, TILE)
        in_seq = tokens < seq_len
        offsets = tokens[:, None] * NUM_KV_HEADS * HEAD_DIM + head_offset + dims[None, :]
        k = tl.load(keys_ptr + offsets, mask=in_seq[:, None], other=0.0).to(tl.float32)
        scores = tl.sum(k * q[None, :], axis=1) * scale
        m = tl.maximum(m, tl.where(in_seq, scores, float("-inf")))
    m_max = tl.max(m, axis=0)

    # Pass 2: the softmax's numerator (weighted values) and denominator.
    denominator = tl.zeros([TILE], dtype=tl.float32)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for start in range(0, seq_len, TILE):
        tokens = start + tl.arange(0, TILE)
        in_seq = tokens < seq_len
        offsets = tokens[:, None] * NUM_KV_HEADS * HEAD_DIM + head_offset + dims[None, :]
        k = tl.load(keys_ptr + offsets, mask=in_seq[:, None], other=0.0).to(tl.float32)
        v = tl.load(values_ptr + offsets, mask=in_seq[:, None], other=0.0).to(tl.float32)
        p = tl.exp(tl.where(in_seq, tl.sum(k * q[None, :], axis=1) * scale, float("-inf")) - m_max)
        denominator += p
        acc += tl.sum(p[:, None] * v, axis=0)
    tl.store(out_ptr + head * HEAD_DIM + dims, acc / tl.sum(denominator, axis=0))


def contiguous_decode(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tile=16):
    """One sequence's decode attention over contiguous K/V.

    Args:
        query: (num_heads, head_dim).
        keys, values: (seq_len, num_kv_heads, head_dim), contiguous.

    Returns:
        (num_heads, head_dim), in query's dtype.
    """
    num_heads, head_dim = query.shape
    seq_len, num_kv_heads, _ = keys.shape
    out = torch.empty_like(query)
    _contiguous_decode_kernel[(num_heads,)](
        out,
        query.contiguous(),
        keys.contiguous(),
        values.contiguous(),
        seq_len,
        head_dim**-0.5,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        TILE=tile,
    )
    return out


@triton.jit
def _gqa_decode_kernel(
    out_ptr,  # (num_seqs, num_heads, head_dim) output
    query_ptr,  # (num_seqs, num_heads, head_dim)
    kv_cache_ptr,  # (2, num_blocks, block_size, num_kv_heads, head_dim)
    block_table_ptr,  # (num_seqs, max_num_blocks_per_seq) int32
    seq_lens_ptr,  # (num_seqs,) int32
    scale,
    stride_kv_kind,
    stride_kv_block,
    stride_kv_slot,
    stride_kv_head,
    stride_bt_seq,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two
    HEAD_DIM: tl.constexpr,  # a power of two
    BLOCK_SIZE: tl.constexpr,  # a power of two
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)  # one program per (sequence, KV head)
    seq_len = tl.load(seq_lens_ptr + seq)
    dims = tl.arange(0, HEAD_DIM)
    slots = tl.arange(0, BLOCK_SIZE)
    # The GROUP query rows that share this KV head, as one (GROUP_PAD, HEAD_DIM) matrix;
    # padding rows are zero and never stored.
    rows = tl.arange(0, GROUP_PAD)
    row_mask = rows < GROUP
    row_offsets = (seq * NUM_HEADS + kv_head * GROUP + rows)[:, None] * HEAD_DIM + dims[None, :]
    q = tl.load(query_ptr + row_offsets, mask=row_mask[:, None], other=0.0).to(tl.float32)
    k_head_ptr = kv_cache_ptr + kv_head * stride_kv_head
    v_head_ptr = k_head_ptr + stride_kv_kind
    num_logical_blocks = tl.cdiv(seq_len, BLOCK_SIZE)

    # Pass 1: each row's largest score. A block's keys are loaded once for all GROUP rows.
    m = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    for logical in range(0, num_logical_blocks):
        block = tl.load(block_table_ptr + seq * stride_bt_seq + logical).to(tl.int64)
        in_seq = logical * BLOCK_SIZE + slots < seq_len
        offsets = block * stride_kv_block + slots[:, None] * stride_kv_slot + dims[None, :]
        k = tl.load(k_head_ptr + offsets, mask=in_seq[:, None], other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # (GROUP_PAD, BLOCK)
        scores = tl.where(in_seq[None, :], scores, float("-inf"))
        m = tl.maximum(m, tl.max(scores, axis=1))

    # Pass 2: the weighted values and the denominator, per row.
    denominator = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    for logical in range(0, num_logical_blocks):
        block = tl.load(block_table_ptr + seq * stride_bt_seq + logical).to(tl.int64)
        in_seq = logical * BLOCK_SIZE + slots < seq_len
        offsets = block * stride_kv_block + slots[:, None] * stride_kv_slot + dims[None, :]
        k = tl.load(k_head_ptr + offsets, mask=in_seq[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_head_ptr + offsets, mask=in_seq[:, None], other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        p = tl.exp(tl.where(in_seq[None, :], scores, float("-inf")) - m[:, None])
        denominator += tl.sum(p, axis=1)
        acc += tl.sum(p[:, :, None] * v[None, :, :], axis=1)
    tl.store(out_ptr + row_offsets, acc / denominator[:, None], mask=row_mask[:, None])


def gqa_paged_decode(query, kv_cache, block_table, seq_lens) -> torch.Tensor:
    """Decode attention with one program per (sequence, KV head), two passes per block."""
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    _gqa_decode_kernel[(num_seqs, num_kv_heads)](
        out,
        query.contiguous(),
        kv_cache,
        block_table,
        seq_lens,
        head_dim**-0.5,
        *kv_cache.stride()[:4],
        block_table.stride(0),
        NUM_HEADS=num_heads,
        GROUP=group,
        GROUP_PAD=triton.next_power_of_2(group),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=kv_cache.shape[2],
    )
    return out


@triton.jit
def _split_decode_kernel(
    out_ptr,  # (num_seqs, num_heads, num_splits, head_dim) float32: each chunk's output
    lse_ptr,  # (num_seqs, num_heads, num_splits) float32: each chunk's log-sum-exp
    query_ptr,
    kv_cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    scale,
    stride_kv_kind,
    stride_kv_block,
    stride_kv_slot,
    stride_kv_head,
    stride_bt_seq,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)  # which chunk of the context
    seq_len = tl.load(seq_lens_ptr + seq)
    # This split's logical blocks [first, last): the blocks cut into NUM_SPLITS runs.
    blocks_per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_SIZE), NUM_SPLITS)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, tl.cdiv(seq_len, BLOCK_SIZE))
    dims = tl.arange(0, HEAD_DIM)
    slots = tl.arange(0, BLOCK_SIZE)
    rows = tl.arange(0, GROUP_PAD)
    row_mask = rows < GROUP
    heads = kv_head * GROUP + rows
    q_offsets = (seq * NUM_HEADS + heads)[:, None] * HEAD_DIM + dims[None, :]
    q = tl.load(query_ptr + q_offsets, mask=row_mask[:, None], other=0.0).to(tl.float32)
    k_head_ptr = kv_cache_ptr + kv_head * stride_kv_head
    v_head_ptr = k_head_ptr + stride_kv_kind

    # One pass: the online softmax over this chunk's blocks.
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    for logical in range(first, last):
        block = tl.load(block_table_ptr + seq * stride_bt_seq + logical).to(tl.int64)
        in_seq = logical * BLOCK_SIZE + slots < seq_len
        offsets = block * stride_kv_block + slots[:, None] * stride_kv_slot + dims[None, :]
        k = tl.load(k_head_ptr + offsets, mask=in_seq[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_head_ptr + offsets, mask=in_seq[:, None], other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        scores = tl.where(in_seq[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new

    # An empty chunk (past the end of a short sequence) stores output 0 and lse -inf: the
    # merge gives it weight 0.
    has_tokens = l_i > 0
    out = tl.where(has_tokens[:, None], acc / tl.where(has_tokens, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(has_tokens, m_i + tl.log(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
    split_rows = (seq * NUM_HEADS + heads) * NUM_SPLITS + split
    tl.store(out_ptr + split_rows[:, None] * HEAD_DIM + dims[None, :], out, mask=row_mask[:, None])
    tl.store(lse_ptr + split_rows, lse, mask=row_mask)


def split_paged_decode(query, kv_cache, block_table, seq_lens, num_splits: int = 2):
    """Split-K decode attention: each context cut into ``num_splits`` runs of blocks, one
    program per (sequence, KV head, split), merged by ``merge_splits``.

    Returns:
        (num_seqs, num_heads, head_dim) output, and the (num_seqs, num_heads, num_splits)
        log-sum-exp of each split (-inf for a split with no tokens).
    """
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    parts = torch.empty(
        (num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=query.device
    )
    lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=query.device)
    _split_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        parts,
        lse,
        query.contiguous(),
        kv_cache,
        block_table,
        seq_lens,
        head_dim**-0.5,
        *kv_cache.stride()[:4],
        block_table.stride(0),
        NUM_HEADS=num_heads,
        GROUP=group,
        GROUP_PAD=triton.next_power_of_2(group),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=kv_cache.shape[2],
        NUM_SPLITS=num_splits,
    )
    return merge_splits(parts, lse).to(query.dtype), lse


def merge_splits(parts: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Each split's output weighted by its share of the softmax denominator, softmax(lse).

    Args:
        parts: (..., num_splits, head_dim) each split's normalised output.
        lse: (..., num_splits) each split's log-sum-exp; -inf for an empty split.
    """
    weights = torch.softmax(lse, dim=-1)  # exp(lse_s) / sum of exp(lse), 0 for -inf
    return (weights[..., None] * parts).sum(dim=-2)
