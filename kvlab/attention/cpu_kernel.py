"""Build, load and call the C paged decode kernel (``paged_decode_cpu.c``).

The kernel is plain C with no dependency on torch's headers, so the machine's C compiler
builds it in well under a second, the first time it is needed. The library is kept in
``~/.cache/kvlab/native`` (``kvlab.env.cache_dir``), named after the source, the compiler
flags and this CPU's features (``-march=native`` code must not run on another CPU). It is
called through ``ctypes`` with the tensors' data pointers: no copies, one call per layer.

Threads: the kernel parallelizes over (sequence, kv head) with OpenMP, as many threads as
``torch.get_num_threads()``. It links ``libgomp.so.1``, which torch has already loaded, so
both share one OpenMP runtime instead of two competing for the cores.

Not handled: compilers other than a ``cc``/``gcc``/``clang`` that takes GCC's flags (an
Apple clang without OpenMP builds a one-thread kernel), Windows.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from kvlab.env import cache_dir

SOURCE = Path(__file__).with_name("paged_decode_cpu.c")
FLAGS = ["-O3", "-march=native", "-ffast-math", "-shared", "-fPIC"]


class KernelUnavailable(RuntimeError):
    """The C kernel cannot be built here; the message says why and what to use instead."""


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
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = kv.shape[-2]
    _check(query, kv, block_ids, seq_lens, block_size)
    query = query.contiguous()
    out = torch.empty_like(query)
    failed = _library().paged_decode_attention(
        out.data_ptr(), query.data_ptr(), kv[0].data_ptr(), kv[1].data_ptr(),
        block_ids.data_ptr(), seq_lens.data_ptr(),
        num_seqs, num_heads, num_kv_heads, head_dim, block_size, block_ids.shape[1],
        scale, torch.get_num_threads(),
    )  # fmt: skip
    if failed:
        raise ValueError(
            f"the C kernel takes at most 16 query heads per kv head, block_size 256 and "
            f"head_dim 256; got {num_heads // num_kv_heads}, {block_size} and {head_dim}. "
            f"Use attention='sdpa'."
        )
    return out


def available() -> bool:
    """Whether the kernel is built, or can be, on this machine (builds it if needed)."""
    try:
        _library()
    except KernelUnavailable:
        return False
    return True


def _check(query, kv, block_ids, seq_lens, block_size) -> None:
    for name, tensor, dtype in (
        ("query", query, torch.float32),
        ("kv", kv, torch.float32),
        ("block_ids", block_ids, torch.int64),
        ("seq_lens", seq_lens, torch.int64),
    ):
        if tensor.device.type != "cpu" or tensor.dtype != dtype:
            raise ValueError(
                f"the C kernel needs {name} as {dtype} on the CPU, got {tensor.dtype} on "
                f"{tensor.device}; use attention='sdpa' (or 'triton' on a GPU)"
            )
    if not (kv.is_contiguous() and block_ids.is_contiguous() and seq_lens.is_contiguous()):
        raise ValueError("kv, block_ids and seq_lens must be contiguous")
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = kv.shape[-2]
    if num_heads % num_kv_heads or kv.shape[-1] != head_dim:
        raise ValueError(
            f"query (num_seqs, num_heads, head_dim) = {tuple(query.shape)} does not fit kv "
            f"{tuple(kv.shape)}: num_heads must be a multiple of num_kv_heads "
            f"({num_kv_heads}), and head_dim equal ({kv.shape[-1]})"
        )
    if block_ids.shape[0] != num_seqs or seq_lens.shape != (num_seqs,):
        raise ValueError(
            f"block_ids {tuple(block_ids.shape)} and seq_lens {tuple(seq_lens.shape)} must "
            f"have one row per query ({num_seqs})"
        )
    if num_seqs and not (1 <= int(seq_lens.min()) and
                         int(seq_lens.max()) <= block_ids.shape[1] * block_size):  # fmt: skip
        raise ValueError(
            f"seq_lens must be between 1 and blocks_per_seq * block_size "
            f"({block_ids.shape[1]} * {block_size}), got {seq_lens.tolist()}"
        )


@cache
def _library() -> ctypes.CDLL:
    library = ctypes.CDLL(str(_build()))
    function = library.paged_decode_attention
    function.restype = ctypes.c_int
    pointers, sizes = [ctypes.c_void_p] * 6, [ctypes.c_int64] * 6
    function.argtypes = pointers + sizes + [ctypes.c_float, ctypes.c_int]
    return library


def _build() -> Path:
    """The compiled library, built on first use: with OpenMP if the compiler has it."""
    compiler = next(
        (found for name in ("cc", "gcc", "clang") if (found := shutil.which(name))), None
    )
    if compiler is None:
        raise KernelUnavailable(
            "attention='cpu' compiles a small C kernel on first use, and no C compiler "
            "(cc, gcc or clang) is on PATH. Install one (Debian: apt-get install gcc) or "
            "use attention='sdpa'."
        )
    source = SOURCE.read_bytes()
    errors = []
    for openmp in (["-fopenmp"], []):
        flags = FLAGS + openmp
        key = hashlib.sha256(source + " ".join(flags).encode() + _cpu_features()).hexdigest()
        target = _cache_dir() / f"paged_decode_cpu-{key[:16]}.so"
        if target.exists():
            return target
        # Built beside its final name, then renamed: two processes may build at once.
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            built = Path(scratch) / target.name
            done = subprocess.run(
                [compiler, *flags, str(SOURCE), "-o", str(built), "-lm"],
                capture_output=True, text=True,
            )  # fmt: skip
            if done.returncode == 0:
                os.replace(built, target)
                return target
            errors.append(done.stderr.strip())
    raise KernelUnavailable(
        f"{compiler} could not build {SOURCE.name}:\n{errors[-1]}\nUse attention='sdpa'."
    )


def _cache_dir() -> Path:
    directory = cache_dir() / "native"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _cpu_features() -> bytes:
    """What ``-march=native`` depends on: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        wanted = [line for line in lines if line.startswith(("model name", "flags"))][:2]
        return "\n".join(wanted).encode()
    except OSError:
        return platform.processor().encode() + platform.machine().encode()
