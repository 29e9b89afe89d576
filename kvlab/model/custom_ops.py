"""The runner's work between the matrix multiplies as three C calls: vLLM's custom ops.

The eager ``ModelRunner`` makes each RMSNorm, residual add, SiLU-and-multiply and rotary
embedding out of several PyTorch calls (``runner.py``). In a decode step their
tensors are small and each follows a multiply that has just streamed a layer's weights
through the caches, so those calls cost more than their arithmetic (``python -m
kvlab.measure.decode_step --by-part`` times them inside the step). ``CustomOpsRunner``
makes the same step with three C functions (``custom_ops.c``), named as vLLM names the
custom ops its CPU backend calls for the same work:

    fused_add_rms_norm   x += residual, then h = RMSNorm(x) * weight, in one pass
    silu_and_mul         SiLU(gate) * up, straight from the fused gate|up output
    rotary_embedding     q and k rotated in place, inside the fused q|k|v output

so that a layer reads

    q, k, v = rotary_embedding(qkv_proj(h))
    cache.write(layer, meta, k, v); a = attention(q, ...)
    h = fused_add_rms_norm(x, o_proj(a), post_attention_layernorm)
    h = fused_add_rms_norm(x, down_proj(silu_and_mul(gate_up_proj(h))), next layer's input norm)

The residual stream ``x`` is updated in place; each norm takes the add before it with it
(the next layer's input norm takes the MLP's add; the last layer's, the final norm).

The C sums are reordered for SIMD, so the results differ from the eager runner's in the
last bits (SmolLM2's logits by up to about 1e-4); tests compare greedy tokens with the
eager runner's and with transformers', as they do for oneDNN.

The benchmarks run kvlab with it where it builds (``python -m kvlab.measure.decode_step``
times both runners side by side); ``LLM(custom_ops=True)`` asks for it. The labs read and
run the eager runner.

Not handled: GPUs and dtypes other than float32 (``ModelRunner``, or ``LLM(compile=True)``
for inductor's fusions on a CPU).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kvlab.cache.base import ForwardBatch, KVCache
from kvlab.model.runner import ModelRunner
from kvlab.native import NativeLibrary


def _declare(library: ctypes.CDLL) -> None:
    pointer, size, threads = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    signatures = {
        "fused_add_rms_norm": [pointer] * 4 + [size] * 2 + [ctypes.c_float, threads],
        "silu_and_mul": [pointer] * 2 + [size] * 2 + [threads],
        "rotary_embedding": [pointer] * 3 + [size] * 4 + [threads],
    }
    for name, argtypes in signatures.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, None


LIBRARY = NativeLibrary(
    Path(__file__).with_name("custom_ops.c"),
    _declare,
    option="custom_ops=True",
    instead="custom_ops=False",
)


def available() -> bool:
    """Whether the custom ops are built, or can be, on this machine (builds them if needed)."""
    return LIBRARY.available()


def benchmark_default(device: str | torch.device) -> bool:
    """Whether the benchmarks run kvlab with custom ops on ``device``: on a CPU where they
    build (each decode step 3-5% faster in ``decode_step``'s side-by-side runs at one
    thread)."""
    return torch.device(device).type == "cpu" and available()


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x += residual`` in place (None: no add), then ``RMSNorm(x) * weight``, returned
    (written into ``out`` when given). ``x``, ``residual``, ``out``: (rows, width)."""
    rows, width = _shape("x", x, "rows, width")
    _require("x", x, (rows, width))
    _require("weight", weight, (width,))
    if residual is not None:
        _require("residual", residual, (rows, width))
    out = torch.empty_like(x) if out is None else out
    _require("out", out, (rows, width))
    LIBRARY.load().fused_add_rms_norm(
        out.data_ptr(), x.data_ptr(), None if residual is None else residual.data_ptr(),
        weight.data_ptr(), rows, width, eps, torch.get_num_threads(),
    )  # fmt: skip
    return out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``SiLU(gate) * up`` for ``gate_up`` (rows, 2 * width), gate first: (rows, width)."""
    rows, double = _shape("gate_up", gate_up, "rows, 2 * width")
    _require("gate_up", gate_up, (rows, double))
    if double % 2:
        raise ValueError(f"gate_up's rows must hold gate then up, an even width; got {double}")
    out = gate_up.new_empty(rows, double // 2)
    LIBRARY.load().silu_and_mul(
        out.data_ptr(), gate_up.data_ptr(), rows, double // 2, torch.get_num_threads()
    )
    return out


def rotary_embedding(heads: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotates ``heads`` (rows, num_heads, head_dim) in place by each row's angles, as
    ``kvlab.model.runner.apply_rotary`` does. ``cos``, ``sin``: (rows, head_dim). Each row's
    heads lie side by side; rows may lie further apart (a slice of the q|k|v output)."""
    rows, num_heads, head_dim = _shape("heads", heads, "rows, num_heads, head_dim")
    if (
        heads.dtype != torch.float32
        or heads.device.type != "cpu"
        or heads.stride()[1:] != (head_dim, 1)
        or heads.stride(0) < num_heads * head_dim
        or head_dim % 2
    ):
        raise ValueError(
            f"heads must be float32 on the CPU, (rows, num_heads, head_dim) with an even "
            f"head_dim and each row's heads side by side; got {tuple(heads.shape)} "
            f"{heads.dtype} on {heads.device}, strides {heads.stride()}"
        )
    _require("cos", cos, (rows, head_dim))
    _require("sin", sin, (rows, head_dim))
    LIBRARY.load().rotary_embedding(
        heads.data_ptr(), cos.data_ptr(), sin.data_ptr(), rows, num_heads, head_dim,
        heads.stride(0), torch.get_num_threads(),
    )  # fmt: skip


def _shape(name: str, tensor: torch.Tensor, axes: str) -> tuple[int, ...]:
    """``tensor``'s shape, once it has one dimension per name in ``axes``."""
    if tensor.dim() != len(axes.split(", ")):
        raise ValueError(f"{name} must be ({axes}), got shape {tuple(tensor.shape)}")
    return tuple(tensor.shape)


def _require(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if (
        tensor.dtype != torch.float32
        or tensor.device.type != "cpu"
        or tuple(tensor.shape) != shape
        or not tensor.is_contiguous()
    ):
        raise ValueError(
            f"{name} must be a contiguous float32 CPU tensor of shape {shape}; got "
            f"{tuple(tensor.shape)} {tensor.dtype} on {tensor.device}, strides {tensor.stride()}"
        )


class CustomOpsRunner(ModelRunner):
    """``ModelRunner`` with its work between the multiplies as C custom ops; same
    arguments and result.

    Raises:
        ValueError: the model is not float32 on the CPU.
        kvlab.native.KernelUnavailable: no C compiler builds ``custom_ops.c`` here.
    """

    def __init__(self, hf_model, attention="reference", onednn: bool | None = None):
        super().__init__(hf_model, attention, onednn)
        if self.device.type != "cpu" or self.dtype != torch.float32:
            raise ValueError(
                f"custom_ops=True runs float32 models on the CPU, got {self.dtype} on "
                f"{self.device}; use custom_ops=False"
            )
        LIBRARY.load()

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch, cache: KVCache) -> torch.Tensor:
        """Same as ``ModelRunner.forward``."""
        meta = cache.begin_step(batch)
        x = self.model.embed_tokens(input_ids)  # (num_tokens, hidden): the residual stream
        cos, sin = self.rotary(batch.positions)  # (num_tokens, head_dim)
        num_tokens, layers = x.shape[0], self.model.layers
        h = fused_add_rms_norm(x, None, layers[0].input_layernorm.weight, self.eps)
        # The norm after each layer: the next layer's input norm, or the model's final norm.
        next_norms = [layer.input_layernorm.weight for layer in layers[1:]]
        next_norms.append(self.model.norm.weight)
        steps = zip(layers, self.weights.layers, next_norms, strict=True)
        for index, (layer, weights, next_norm) in enumerate(steps):
            q, k, v = self._rotated_qkv(weights.qkv_proj(h), cos, sin)
            cache.write(index, meta, k, v)
            attended = self.attention(q, index, meta, cache, self.scale)
            attn_out = weights.o_proj(attended.reshape(num_tokens, -1))
            norm = layer.post_attention_layernorm.weight
            h = fused_add_rms_norm(x, attn_out, norm, self.eps, out=h)
            mlp_out = weights.down_proj(silu_and_mul(weights.gate_up_proj(h)))
            h = fused_add_rms_norm(x, mlp_out, next_norm, self.eps, out=h)
        last_rows = batch.query_start_loc[1:] - 1
        return self.weights.lm_head(h[last_rows])

    def _rotated_qkv(self, qkv, cos, sin):
        """q, k, v as heads (views of ``qkv``), q and k rotated in place."""
        num_tokens, num_qk_heads = qkv.shape[0], self.num_heads + self.num_kv_heads
        qk = qkv[:, : num_qk_heads * self.head_dim].view(num_tokens, num_qk_heads, self.head_dim)
        v = qkv[:, num_qk_heads * self.head_dim :].view(num_tokens, -1, self.head_dim)
        rotary_embedding(qk, cos, sin)
        return qk[:, : self.num_heads], qk[:, self.num_heads :], v
