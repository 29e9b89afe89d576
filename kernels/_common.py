"""What the kvlab kernels share: one ``tl.dot`` helper and the input checks of the wrappers.

The checks run before every launch and name the parameter, the value found and what is
allowed, because a kernel that reads through a wrong ``block_table`` does not fail: it
silently reads another sequence's keys (or crashes the GPU). Checking values (not just
shapes) costs a host-device sync per call; ``check_values=False`` skips that part, as a
production engine would.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl


def _runs_in_interpreter() -> bool:
    knobs = getattr(triton, "knobs", None)  # triton >= 3.4
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Decided once, when kvlab.kernels is imported (its __init__ sets TRITON_INTERPRET first),
# which is also when @triton.jit decides whether our kernels compile or are interpreted.
RUNS_IN_INTERPRETER: bool = _runs_in_interpreter()

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# The smallest tile tl.dot accepts on NVIDIA GPUs is 16 x 16 x 16.
MIN_DOT_SIZE = 16


@triton.jit
def dot(a, b, DOT_IN_FP32: tl.constexpr):
    """``a @ b`` with fp32 accumulation.

    "ieee" keeps fp32 inputs exact (the default, tf32, rounds them to 10 mantissa bits);
    Triton ignores it for fp16/bf16 inputs, which tensor cores multiply exactly anyway.
    NOTE: DOT_IN_FP32 exists for Triton's interpreter, whose tl.dot multiplies the raw bits
    of bfloat16 tiles as integers (triton 3.9); the wrappers set it only there.
    """
    if DOT_IN_FP32:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision="ieee")


def dot_in_fp32(dtype: torch.dtype) -> bool:
    """Whether kernels must upcast tl.dot operands (bfloat16 under the interpreter only)."""
    return RUNS_IN_INTERPRETER and dtype == torch.bfloat16


def padded(n: int, at_least: int = 1) -> int:
    """The power of two >= n (and >= at_least): tl.arange needs power-of-two lengths."""
    return max(at_least, triton.next_power_of_2(n))


def default_scale(head_dim: int, scale: float | None) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


class InputChecker:
    """Checks a kernel wrapper's arguments; every message starts with the wrapper's name."""

    def __init__(self, fn_name: str):
        self.fn_name = fn_name

    def fail(self, message: str, error: type[Exception] = ValueError):
        raise error(f"{self.fn_name}: {message}")

    def tensor(self, name: str, value, ndim: int, dtypes: tuple[torch.dtype, ...]) -> None:
        if not isinstance(value, torch.Tensor):
            self.fail(f"{name} must be a torch.Tensor, got {type(value).__name__}", TypeError)
        if value.dim() != ndim:
            self.fail(f"{name} must have {ndim} dimensions, got shape {tuple(value.shape)}")
        if value.dtype not in dtypes:
            allowed = ", ".join(str(d) for d in dtypes)
            self.fail(f"{name} must have dtype {allowed}; got {value.dtype}", TypeError)

    def size(self, name: str, value: torch.Tensor, dim: int, expected: int, why: str) -> None:
        if value.shape[dim] != expected:
            self.fail(
                f"{name}.shape[{dim}] must be {expected} ({why}), got shape {tuple(value.shape)}"
            )

    def kv_cache(self, kv_cache, name: str = "kv_cache") -> None:
        self.tensor(name, kv_cache, 5, SUPPORTED_DTYPES)
        if kv_cache.shape[0] != 2:
            self.fail(
                f"{name} must have shape (2, num_blocks, block_size, num_kv_heads, head_dim) "
                f"with keys at [0] and values at [1]; got shape {tuple(kv_cache.shape)}"
            )
        if kv_cache.stride(-1) != 1:
            self.fail(f"{name} must be contiguous along head_dim, got strides {kv_cache.stride()}")

    def same_device(self, **tensors: torch.Tensor) -> None:
        devices = {name: t.device for name, t in tensors.items()}
        if len(set(devices.values())) > 1:
            found = ", ".join(f"{name} on {device}" for name, device in devices.items())
            self.fail(f"all tensors must be on one device, got {found}")
        device = next(iter(devices.values()))
        if device.type != "cuda" and not RUNS_IN_INTERPRETER:
            self.fail(
                f"tensors are on {device}, but Triton compiles kernels for CUDA only; run on a "
                "CUDA device, or set TRITON_INTERPRET=1 before Python starts to use the "
                "(slow) interpreter",
                RuntimeError,
            )

    def scale(self, scale: float | None) -> None:
        if scale is None:
            return
        if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            self.fail(
                f"scale must be None (1 / sqrt(head_dim)) or a positive number, got {scale!r}"
            )

    def seq_lens_and_block_table(
        self, seq_lens: torch.Tensor, block_table: torch.Tensor, kv_cache: torch.Tensor
    ) -> None:
        """Every sequence holds >= 1 token, fits its block_table row, and uses real blocks."""
        num_blocks, block_size = kv_cache.shape[1], kv_cache.shape[2]
        capacity = block_table.shape[1] * block_size
        if seq_lens.numel() == 0:
            return
        low, high = int(seq_lens.min()), int(seq_lens.max())
        if low < 1 or high > capacity:
            self.fail(
                f"seq_lens must lie in [1, max_num_blocks_per_seq * block_size] = [1, {capacity}]"
                f", got values from {low} to {high}"
            )
        # Only the first ceil(seq_len / block_size) entries of a row are read.
        num_used = (seq_lens.long() + block_size - 1) // block_size
        columns = torch.arange(block_table.shape[1], device=block_table.device)
        used = block_table[columns[None, :] < num_used[:, None]]
        if used.numel() and (int(used.min()) < 0 or int(used.max()) >= num_blocks):
            self.fail(
                f"block_table entries in use must lie in [0, num_blocks) = [0, {num_blocks}), "
                f"got values from {int(used.min())} to {int(used.max())}"
            )
