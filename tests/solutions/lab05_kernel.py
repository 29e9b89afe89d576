"""Lab 05's build-it, solved as a learner would: the notebook's my_decode_kernel cell.

Only the loop body is the learner's; the rest is the cell as the lab gives it.
"""

import triton
import triton.language as tl


@triton.jit
def my_decode_kernel(
    out_ptr,  # (num_seqs, num_heads, head_dim) output, contiguous
    query_ptr,  # (num_seqs, num_heads, head_dim) one new query token per sequence, contiguous
    kv_cache_ptr,  # (2, num_blocks, block_size, num_kv_heads, head_dim): [0] keys, [1] values
    block_table_ptr,  # (num_seqs, max_num_blocks_per_seq) int32: logical -> physical block
    seq_lens_ptr,  # (num_seqs,) int32: tokens in each sequence
    scale,  # softmax scale, 1 / sqrt(head_dim)
    stride_kv_kind,  # elements from a key to its value (kv_cache[0] -> kv_cache[1])
    stride_kv_block,  # elements between consecutive physical blocks
    stride_kv_slot,  # elements between consecutive tokens of a block
    stride_kv_head,  # elements between consecutive KV heads
    stride_bt_seq,  # elements between consecutive block_table rows
    NUM_HEADS: tl.constexpr,  # query heads
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,  # head_dim (a power of two)
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block (a power of two)
):
    # The same program as section 3's kernel: one query head of one sequence.
    seq = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    dims = tl.arange(0, HEAD_DIM)
    slots = tl.arange(0, BLOCK_SIZE)
    q = tl.load(query_ptr + (seq * NUM_HEADS + head) * HEAD_DIM + dims).to(tl.float32)
    k_head_ptr = kv_cache_ptr + (head // GROUP) * stride_kv_head
    v_head_ptr = k_head_ptr + stride_kv_kind

    m_i = tl.full([], float("-inf"), dtype=tl.float32)  # the running max of the scores
    l_i = tl.zeros([], dtype=tl.float32)  # the running sum of exp(score - m_i)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)  # the running, unnormalised output
    for logical in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        block = tl.load(block_table_ptr + seq * stride_bt_seq + logical).to(tl.int64)
        in_seq = logical * BLOCK_SIZE + slots < seq_len
        offsets = block * stride_kv_block + slots[:, None] * stride_kv_slot + dims[None, :]
        k = tl.load(k_head_ptr + offsets, mask=in_seq[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_head_ptr + offsets, mask=in_seq[:, None], other=0.0).to(tl.float32)
        scores = tl.where(in_seq, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new

    tl.store(out_ptr + (seq * NUM_HEADS + head) * HEAD_DIM + dims, acc / l_i)
