"""Call the C paged decode kernel (``paged_decode_cpu.c``) on torch tensors.

The kernel is built on first use by the machine's C compiler (``kvlab.native``) and called
through ``ctypes`` with the tensors' data pointers: no copies, one call per layer. It
parallelizes over (sequence, kv head), as many threads as ``torch.get_num_threads()``.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kvlab.native import NativeLibrary

# The C file's fixed buffers (its #defines; a test checks they agree).
MAX_GROUP, MAX_BLOCK, MAX_HEAD_DIM = 16, 256, 256


def paged_decode_attention_cpu(
    query: torch.Tensor,
    kv: torch.Tensor,
    block_ids: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """One query per sequence attends to its cached K/V, read in place from the pool.

    Args:
        query: (num_seqs, num_heads, head_dim) float32 on the CPU.
        kv: one layer's cache, (2, num_blocks, block_size, num_kv_heads, head_dim) or
            (2, num_slots, num_kv_heads, head_dim) with ``block_size`` 1; contiguous.
        block_ids: (num_seqs, blocks_per_seq) int64, each sequence's blocks in order.
        seq_lens: (num_seqs,) int64, tokens each sequence holds (at least one).
        block_size: slots per block.
        scale: the softmax scale, usually head_dim ** -0.5.

    Returns:
        (num_seqs, num_heads, head_dim), the attention output of each query.
    """
    _check(query, kv, block_ids, seq_lens, block_size)
    num_seqs, num_heads, head_dim = query.shape
    query = query.contiguous()
    out = torch.empty_like(query)
    bad_seq = ctypes.c_int64(-1)
    failed = LIBRARY.load().paged_decode_attention(
        out.data_ptr(), query.data_ptr(), kv[0].data_ptr(), kv[1].data_ptr(),
        block_ids.data_ptr(), seq_lens.data_ptr(),
        num_seqs, num_heads, kv.shape[-2], head_dim, block_size, block_ids.shape[1],
        kv.shape[1], scale, torch.get_num_threads(), ctypes.byref(bad_seq),
    )  # fmt: skip
    if failed:
        raise ValueError(_table_error(failed, bad_seq.value, block_ids, seq_lens, kv, block_size))
    return out


def _table_error(code: int, i: int, block_ids, seq_lens, kv, block_size) -> str:
    """The message for the kernel's own checks of seq_lens and the block ids read."""
    if code == 2:
        return (
            f"seq_lens[{i}] = {int(seq_lens[i])}: each sequence must hold between 1 and "
            f"blocks_per_seq * block_size = {block_ids.shape[1]} * {block_size} tokens"
        )
    read = block_ids[i, : -(-int(seq_lens[i]) // block_size)].tolist()
    return f"block_ids[{i}] reads blocks {read}, not all in the pool's 0..{kv.shape[1] - 1}"


def available() -> bool:
    """Whether the kernel is built, or can be, on this machine (builds it if needed)."""
    return LIBRARY.available()


def _check(query, kv, block_ids, seq_lens, block_size) -> None:
    """Dtypes, devices, layouts and shapes; the kernel itself checks the values it reads."""
    for name, tensor, dtype in (
        ("query", query, torch.float32),
        ("kv", kv, torch.float32),
        ("block_ids", block_ids, torch.int64),
        ("seq_lens", seq_lens, torch.int64),
    ):
        if tensor.device.type != "cpu" or tensor.dtype != dtype:
            raise ValueError(
                f"the C kernel needs {name} as {dtype} on the CPU, got {tensor.dtype} on "
                f"{tensor.device}; use attention_backend='sdpa' (or 'triton' on a GPU)"
            )
        if name != "query" and not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {tensor.stride()}")
    pool = (2, "num_blocks", block_size, "num_kv_heads", "head_dim")
    if not (kv.dim() == 5 and kv.shape[0] == 2 and kv.shape[2] == block_size) and not (
        kv.dim() == 4 and kv.shape[0] == 2 and block_size == 1
    ):
        raise ValueError(
            f"kv must be one layer's cache {pool} (or without the block_size axis when "
            f"block_size is 1), got {tuple(kv.shape)} with block_size={block_size}"
        )
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = kv.shape[-2]
    if num_kv_heads < 1 or num_heads % num_kv_heads or kv.shape[-1] != head_dim:
        raise ValueError(
            f"query (num_seqs, num_heads, head_dim) = {tuple(query.shape)} does not fit kv "
            f"{tuple(kv.shape)}: num_heads must be a multiple of num_kv_heads "
            f"({num_kv_heads}), and head_dim equal ({kv.shape[-1]})"
        )
    for name, value, most in (
        ("num_heads // num_kv_heads", num_heads // num_kv_heads, MAX_GROUP),
        ("block_size", block_size, MAX_BLOCK),
        ("head_dim", head_dim, MAX_HEAD_DIM),
    ):
        if value > most:
            raise ValueError(
                f"the C kernel takes {name} up to {most}, got {value}; use attention_backend='sdpa'"
            )
    if block_ids.dim() != 2 or block_ids.shape[0] != num_seqs or seq_lens.shape != (num_seqs,):
        raise ValueError(
            f"block_ids {tuple(block_ids.shape)} and seq_lens {tuple(seq_lens.shape)} must "
            f"have one row per query ({num_seqs})"
        )


def _declare(library: ctypes.CDLL) -> None:
    function = library.paged_decode_attention
    function.restype = ctypes.c_int
    pointers, sizes = [ctypes.c_void_p] * 6, [ctypes.c_int64] * 7
    function.argtypes = pointers + sizes + [ctypes.c_float, ctypes.c_int, ctypes.c_void_p]


LIBRARY = NativeLibrary(
    Path(__file__).with_name("paged_decode_cpu.c"),
    _declare,
    option="attention_backend='cpu'",
    instead="attention_backend='sdpa'",
)
