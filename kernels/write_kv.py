"""Writing new keys and values into a paged KV cache, in Triton.

In this lesson you will learn how the ``slot_mapping`` turns the cache write of a step
into one scatter: the scheduler has already decided where each new token goes
(``slot = block_id * block_size + offset_in_block``), so the kernel only splits the slot
back into (block, offset) and copies one token's K and V rows for all KV heads. This is the
``reshape_and_cache`` step that vLLM runs in every attention layer before attention.

Not handled here: quantising to an FP8 cache (per-tensor or per-head scales), layouts that
store keys transposed, or tokens whose slot is out of range (the wrapper rejects them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from kvlab.kernels._common import SUPPORTED_DTYPES, InputChecker, padded


@triton.jit
def _write_kv_kernel(
    key_ptr,  # (num_tokens, num_kv_heads, head_dim) new keys, in the cache's dtype
    value_ptr,  # (num_tokens, num_kv_heads, head_dim) new values, in the cache's dtype
    kv_cache_ptr,  # (2, num_blocks, block_size, num_kv_heads, head_dim): [0] keys, [1] values
    slot_mapping_ptr,  # (num_tokens,) int64 slot of each token; negative = skip (padding)
    stride_key_token,  # elements between consecutive tokens in key
    stride_key_head,  # elements between consecutive heads in key
    stride_value_token,  # elements between consecutive tokens in value
    stride_value_head,  # elements between consecutive heads in value
    stride_kv_kind,  # elements from a key to its value (kv_cache[0] -> kv_cache[1])
    stride_kv_block,  # elements between consecutive physical blocks
    stride_kv_slot,  # elements between consecutive tokens of a block
    stride_kv_head,  # elements between consecutive KV heads
    NUM_KV_HEADS: tl.constexpr,  # real num_kv_heads
    NUM_KV_HEADS_PAD: tl.constexpr,  # num_kv_heads rounded up to a power of two
    HEAD_DIM: tl.constexpr,  # real head_dim
    HEAD_DIM_PAD: tl.constexpr,  # head_dim rounded up to a power of two
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
):
    # One program copies one token: all its KV heads, keys and values.
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)

    # NOTE: vLLM pads batches (for CUDA graphs) with tokens whose slot is -1: nothing to write.
    if slot >= 0:
        # Split the slot back into the physical block and the offset inside it.
        block_id = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE

        # The (NUM_KV_HEADS_PAD, HEAD_DIM_PAD) tile of this token's rows, masked to real size.
        heads = tl.arange(0, NUM_KV_HEADS_PAD)
        dims = tl.arange(0, HEAD_DIM_PAD)
        mask = (heads < NUM_KV_HEADS)[:, None] & (dims < HEAD_DIM)[None, :]

        # Read the new key and value rows.
        key = tl.load(
            key_ptr + token * stride_key_token + heads[:, None] * stride_key_head + dims[None, :],
            mask=mask,
        )
        value = tl.load(
            value_ptr
            + token * stride_value_token
            + heads[:, None] * stride_value_head
            + dims[None, :],
            mask=mask,
        )

        # Write them into the slot: keys at kv_cache[0, block, offset], values at kv_cache[1, ...].
        cache_ptrs = (
            kv_cache_ptr
            + block_id * stride_kv_block
            + offset * stride_kv_slot
            + heads[:, None] * stride_kv_head
            + dims[None, :]
        )
        tl.store(cache_ptrs, key, mask=mask)
        tl.store(cache_ptrs + stride_kv_kind, value, mask=mask)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    check_values: bool = True,
) -> None:
    """Write each new token's key and value into its slot of the cache, in place.

    Args:
        key, value: (num_tokens, num_kv_heads, head_dim), float16, bfloat16 or float32
            (converted to kv_cache's dtype on write).
        kv_cache: (2, num_blocks, block_size, num_kv_heads, head_dim).
        slot_mapping: (num_tokens,) int64, slot = block_id * block_size + offset_in_block,
            each in [0, num_blocks * block_size), or negative to skip a padding token.
        check_values: also check the values of the integer inputs (the slots),
            which copies them to the host and waits for the device. Shapes, dtypes and
            devices are always checked; an engine whose metadata is known good passes False.
    """
    _check_write_inputs(key, value, kv_cache, slot_mapping, check_values)
    # NOTE: converting here, not in the kernel, because Triton's interpreter rounds float32 ->
    # bfloat16 differently from torch and the GPU; the kernel then copies bits unchanged.
    key = key.to(kv_cache.dtype)
    value = value.to(kv_cache.dtype)
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        kv_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        *kv_cache.stride()[:4],
        NUM_KV_HEADS=num_kv_heads,
        NUM_KV_HEADS_PAD=padded(num_kv_heads),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=padded(head_dim),
        BLOCK_SIZE=kv_cache.shape[2],
    )


def _check_write_inputs(key, value, kv_cache, slot_mapping, check_values) -> None:
    check = InputChecker("write_kv")
    check.tensor("key", key, 3, SUPPORTED_DTYPES)
    check.tensor("value", value, 3, SUPPORTED_DTYPES)
    check.kv_cache(kv_cache)
    if value.shape != key.shape:
        check.fail(f"value shape {tuple(value.shape)} must equal key shape {tuple(key.shape)}")
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    if key.shape[1:] != (num_kv_heads, head_dim):
        check.fail(
            f"key must have shape (num_tokens, num_kv_heads, head_dim) = (num_tokens, "
            f"{num_kv_heads}, {head_dim}) to match kv_cache, got {tuple(key.shape)}"
        )
    check.tensor("slot_mapping", slot_mapping, 1, (torch.int64,))
    check.size("slot_mapping", slot_mapping, 0, key.shape[0], "one slot per token in key")
    check.same_device(key=key, value=value, kv_cache=kv_cache, slot_mapping=slot_mapping)
    num_slots = num_blocks * block_size
    if check_values and slot_mapping.numel() and int(slot_mapping.max()) >= num_slots:
        check.fail(
            f"slot_mapping values must be < num_blocks * block_size = {num_slots} "
            f"(or negative to skip a token), got {int(slot_mapping.max())}"
        )
