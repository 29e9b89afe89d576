"""Build, load and call the C paged decode kernel (``paged_decode_cpu.c``).

The kernel is plain C with no dependency on torch's headers, so the machine's C compiler
builds it in well under a second, the first time it is needed. The library is kept in
``~/.cache/kvlab/native`` (``kvlab.env.cache_dir``), named after the source, the compiler
flags and this CPU's features (``-march=native`` code must not run on another CPU). It is
called through ``ctypes`` with the tensors' data pointers: no copies, one call per layer.

Compiled with ``-ffast-math`` (vector ``expf``) but linked without it: GCC links a
``-ffast-math`` shared library with start-up code that makes the whole process flush tiny
floats to zero, torch included (``tests/test_cpu_attention.py`` checks it does not).

Threads: the kernel parallelizes over (sequence, kv head) with OpenMP, as many threads as
``torch.get_num_threads()``. Built by GCC it links ``libgomp.so.1``, which torch's Linux
wheels have already loaded, so both share one OpenMP runtime.

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
from pathlib import Path

import torch

from kvlab.env import cache_dir

SOURCE = Path(__file__).with_name("paged_decode_cpu.c")
COMPILE_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fPIC"]
LINK_FLAGS = ["-shared"]
# The C file's fixed buffers (its #defines; a test checks they agree).
MAX_GROUP, MAX_BLOCK, MAX_HEAD_DIM = 16, 256, 256


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
    _check(query, kv, block_ids, seq_lens, block_size)
    num_seqs, num_heads, head_dim = query.shape
    query = query.contiguous()
    out = torch.empty_like(query)
    bad_seq = ctypes.c_int64(-1)
    failed = _library().paged_decode_attention(
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
    try:
        _library()
    except KernelUnavailable:
        return False
    return True


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


_loaded: ctypes.CDLL | KernelUnavailable | None = None  # the library, or why it is not


def _library() -> ctypes.CDLL:
    """The loaded kernel: built on first use; a build that failed is not tried again."""
    global _loaded
    if _loaded is None:
        try:
            _loaded = _load(_build())
        except KernelUnavailable as error:
            _loaded = error
        except (OSError, subprocess.SubprocessError) as error:  # unwritable cache, bad $CC...
            _loaded = KernelUnavailable(f"the C kernel cannot be built or loaded here: {error}")
    if isinstance(_loaded, KernelUnavailable):
        raise _loaded
    return _loaded


def _load(path: Path) -> ctypes.CDLL:
    library = ctypes.CDLL(str(path))
    function = library.paged_decode_attention
    function.restype = ctypes.c_int
    pointers, sizes = [ctypes.c_void_p] * 6, [ctypes.c_int64] * 7
    function.argtypes = pointers + sizes + [ctypes.c_float, ctypes.c_int, ctypes.c_void_p]
    return library


def _build() -> Path:
    """The compiled library, built on first use: with OpenMP if the compiler has it.

    Compiled and linked in two steps, so that ``-ffast-math`` stays out of the link.
    """
    compiler = os.environ.get("CC") or next(
        (found for name in ("cc", "gcc", "clang") if (found := shutil.which(name))), None
    )
    if compiler is None:
        raise KernelUnavailable(
            "attention_backend='cpu' compiles a small C kernel on first use, and no C "
            "compiler (cc, gcc or clang, or $CC) is on PATH. Install one (Debian: apt-get "
            "install gcc) or use attention_backend='sdpa'."
        )
    identity = SOURCE.read_bytes() + _compiler_version(compiler) + _cpu_features()
    targets = []
    for openmp in (["-fopenmp"], []):
        flags = [*COMPILE_FLAGS, *openmp, "|", *LINK_FLAGS, *openmp]
        key = hashlib.sha256(identity + " ".join(flags).encode()).hexdigest()[:16]
        targets.append((openmp, _cache_dir() / f"paged_decode_cpu-{key}.so"))
    for _, target in targets:
        if target.exists():
            return target
    errors = []
    for openmp, target in targets:
        # Built beside its final name, then renamed: two processes may build at once.
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            obj, built = Path(scratch) / "kernel.o", Path(scratch) / target.name
            steps = (
                [compiler, *COMPILE_FLAGS, *openmp, "-c", str(SOURCE), "-o", str(obj)],
                [compiler, *LINK_FLAGS, *openmp, str(obj), "-o", str(built), "-lm"],
            )
            for step in steps:
                done = subprocess.run(step, capture_output=True, text=True, timeout=300)
                if done.returncode != 0:
                    errors.append(done.stderr.strip())
                    break
            else:
                os.replace(built, target)
                return target
    raise KernelUnavailable(
        f"{compiler} could not build {SOURCE.name}:\n{errors[-1]}\nUse attention_backend='sdpa'."
    )


def _compiler_version(compiler: str) -> bytes:
    done = subprocess.run([compiler, "--version"], capture_output=True, timeout=60)
    return done.stdout


def _cache_dir() -> Path:
    directory = cache_dir() / "native"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _cpu_features() -> bytes:
    """What ``-march=native`` depends on: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        # x86 names its CPU and features "model name" and "flags"; Arm "CPU part", "Features".
        keys = ("model name", "flags", "CPU implementer", "CPU part", "Features")
        wanted = sorted({line for line in lines if line.startswith(keys)})
        return "\n".join(wanted).encode()
    except OSError:
        return platform.processor().encode() + platform.machine().encode()
