"""The runner's work between attention calls, compiled with torch.compile (inductor, CPU).

The eager ``ModelRunner`` makes some 400 PyTorch calls per decode step: the matrix
multiplies, and between them RMSNorms, the rotary embedding, SiLU-and-multiply and the
residual adds, each a separate pass over memory with Python in between. This runner
makes the same step in 31 compiled calls, one per stretch of the model between two
attention calls:

    layer 0        norm -> qkv -> rotary                                  (``_first``)
    cache.write, attention (eager: any cache, any backend)
    layer i|i+1    o -> add -> norm -> gate|up -> SiLU*up -> down -> add
                   -> norm -> qkv -> rotary                               (``_between``)
    cache.write, attention ...
    last layer     o -> add -> norm -> gate|up -> SiLU*up -> down -> add
                   -> final norm at each sequence's last row -> LM head   (``_last``)

The matrix multiplies stay kvlab's oneDNN calls (``kvlab.model.linear``): inductor cannot
trace oneDNN's packed ("opaque") weights, so each multiply enters the graph as one opaque
custom op, ``kvlab::linear``, and inductor fuses what lies between two of them. One graph
serves every layer (the weights are inputs, not constants), and the token dimension is
marked dynamic, so a run compiles each stretch once for any batch (once more for a
one-token step: torch.compile treats size 1 apart).

The arithmetic is the eager runner's, op for op; inductor's fused loops round the RMSNorm
(a sum divided by the width, ``1 / sqrt``) and the SiLU differently in the last bit, and
SmolLM2's logits moved by up to 6e-5, so tests compare greedy tokens with the eager
runner's, as they do for oneDNN against transformers.

NOTE: measured on a 2-core CPU, one thread, this runner is no faster than the eager one
(``python -m kvlab.measure.decode_step --threads 1 --compile``: 1.02-1.04x the eager
step's time at batch 16, 32 and 64). The work it fuses is small (a layer's norm, SiLU and
adds: about 90 us eager, 83 us fused, at batch 32) and each compiled call costs its own
(guards and wrapper, about 20 us; a oneDNN multiply called inside a graph measured some
100 us slower than the same call made eagerly). The compile takes about 14 s the first
time and about 3 s when inductor's on-disk cache already holds the graphs.

Not handled: a GPU (the custom op is oneDNN's CPU call or ``F.linear``; inductor would
need Triton there), CUDA graphs, a compile cache shared between processes beyond what
inductor keeps on disk by itself.
"""

from __future__ import annotations

import os
import shutil

import torch
import torch.nn.functional as F

from kvlab.cache.base import ForwardBatch, KVCache
from kvlab.model.runner import ModelRunner, apply_rotary, rms_norm

# Declared with torch.library.define rather than the @custom_op decorator: a call through
# the decorator's wrapper measured some 23 us slower per multiply here (3% of one at batch
# 32), this one 5 us.
torch.library.define("kvlab::linear", "(Tensor x, Tensor weight, Tensor? bias) -> Tensor")


@torch.library.impl("kvlab::linear", "CompositeExplicitAutograd")
def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``FusedLinear``'s multiply as one op the compiler does not look into."""
    # x: (num_tokens, in), weight: (out, in), oneDNN-packed or row-major -> (num_tokens, out)
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


@torch.library.register_fake("kvlab::linear")
def _linear_shape(x, weight, bias):
    return x.new_empty(x.shape[0], weight.shape[0])


linear = torch.ops.kvlab.linear.default


class CompiledRunner(ModelRunner):
    """``ModelRunner`` with the work between attention calls compiled; same arguments.

    The first steps compile (tens of seconds on a 2-core CPU); later steps of any batch
    size reuse the graphs.

    Raises:
        RuntimeError: torch.compile cannot build CPU code here (``compile_unavailable``).
    """

    def __init__(self, hf_model, attention="reference", onednn: bool | None = None):
        reason = compile_unavailable()
        if reason is not None:
            raise RuntimeError(f"CompiledRunner needs torch.compile: {reason}")
        super().__init__(hf_model, attention, onednn)
        self._first = torch.compile(self._first_eager, dynamic=False)
        self._between = torch.compile(self._between_eager, dynamic=False)
        self._last = torch.compile(self._last_eager, dynamic=False)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch, cache: KVCache) -> torch.Tensor:
        """Same as ``ModelRunner.forward``."""
        meta = cache.begin_step(batch)
        x = self.model.embed_tokens(input_ids)  # (num_tokens, hidden)
        cos, sin = self.rotary(batch.positions)  # (num_tokens, head_dim)
        last_rows = batch.query_start_loc[1:] - 1  # (num_seqs,)
        for tensor in (x, cos, sin):
            _mark_tokens_dynamic(tensor)
        _mark_tokens_dynamic(last_rows)
        num_layers = len(self.model.layers)
        q, k, v = self._first(x, *self._pre_attention_args(0), cos, sin)
        for index in range(num_layers):
            cache.write(index, meta, k, v)
            out = self.attention(q, index, meta, cache, self.scale)  # (num_tokens, heads, head_dim)
            _mark_tokens_dynamic(out)
            post = self._post_attention_args(index)
            if index + 1 < num_layers:
                pre = self._pre_attention_args(index + 1)
                x, q, k, v = self._between(x, out, *post, *pre, cos, sin)
            else:
                head = self.weights.lm_head
                return self._last(x, out, *post, last_rows, self.model.norm.weight, head.weight,
                                  head.bias)  # fmt: skip
        raise AssertionError("unreachable: a model has at least one layer")

    def _pre_attention_args(self, index):
        layer, qkv = self.model.layers[index], self.weights.layers[index].qkv_proj
        return layer.input_layernorm.weight, qkv.weight, qkv.bias

    def _post_attention_args(self, index):
        layer, weights = self.model.layers[index], self.weights.layers[index]
        return (weights.o_proj.weight, weights.o_proj.bias, layer.post_attention_layernorm.weight,
                weights.gate_up_proj.weight, weights.gate_up_proj.bias, weights.down_proj.weight,
                weights.down_proj.bias)  # fmt: skip

    # The three stretches, written as the eager runner writes them (traced by torch.compile).

    def _first_eager(self, x, norm, qkv_weight, qkv_bias, cos, sin):
        h = rms_norm(x, norm, self.eps)
        return self._qkv_rotated(h, qkv_weight, qkv_bias, cos, sin)

    def _between_eager(self, x, out, *args):
        post, (norm, qkv_weight, qkv_bias, cos, sin) = args[:7], args[7:]
        x = self._after_attention(x, out, *post)
        h = rms_norm(x, norm, self.eps)
        return x, *self._qkv_rotated(h, qkv_weight, qkv_bias, cos, sin)

    def _last_eager(self, x, out, *args):
        post, (last_rows, norm, head_weight, head_bias) = args[:7], args[7:]
        x = self._after_attention(x, out, *post)
        h = rms_norm(x[last_rows], norm, self.eps)
        return linear(h, head_weight, head_bias)  # (num_seqs, vocab_size)

    def _qkv_rotated(self, h, qkv_weight, qkv_bias, cos, sin):
        num_tokens = h.shape[0]
        qkv = linear(h, qkv_weight, qkv_bias)
        num_qk_heads = self.num_heads + self.num_kv_heads
        qk = qkv[:, : num_qk_heads * self.head_dim].view(num_tokens, num_qk_heads, self.head_dim)
        v = qkv[:, num_qk_heads * self.head_dim :].view(num_tokens, -1, self.head_dim)
        qk = apply_rotary(qk, cos, sin)
        return qk[:, : self.num_heads], qk[:, self.num_heads :], v

    def _after_attention(self, x, out, o_weight, o_bias, norm, gate_up_weight, gate_up_bias,
                         down_weight, down_bias):  # fmt: skip
        num_tokens = x.shape[0]
        x = x + linear(out.reshape(num_tokens, -1), o_weight, o_bias)
        h = rms_norm(x, norm, self.eps)
        gate, up = linear(h, gate_up_weight, gate_up_bias).chunk(2, dim=-1)
        return x + linear(F.silu(gate) * up, down_weight, down_bias)


def _mark_tokens_dynamic(tensor: torch.Tensor) -> None:
    # Size 1 stays a graph of its own (torch.compile specializes 0 and 1).
    if tensor.shape[0] > 1:
        torch._dynamo.mark_dynamic(tensor, 0)


def compile_unavailable() -> str | None:
    """Why torch.compile cannot build the runner's CPU graphs here, or None when it can."""
    if not torch._dynamo.is_dynamo_supported():
        return f"torch {torch.__version__} has no torch.compile for this Python"
    compilers = [os.environ.get("CXX", ""), "g++", "clang++", "c++"]
    if not any(shutil.which(name) for name in compilers if name):
        return "inductor needs a C++ compiler (g++ or clang++, or $CXX) and none is on PATH"
    return None
