"""The runner's matrix multiplies: fused where they share an input, laid out once for speed.

Most of a decode step's time is its matrix multiplies (about 60% on a CPU, more on a GPU),
so kvlab arranges the weights the way serving engines do, once, when a runner is made:

    q_proj | k_proj | v_proj   ->  one (q + 2 kv, hidden) matrix   (vLLM: QKVParallelLinear)
    gate_proj | up_proj        ->  one (2 intermediate, hidden)    (MergedColumnParallelLinear)
    o_proj, down_proj, lm_head ->  as they are

Four matmuls per layer instead of seven, each wider. On a CPU with oneDNN, float32
weights are then reordered into oneDNN's blocked layout (``torch.ops.mkldnn``, what
vLLM's CPU backend does with its own oneDNN calls): a matmul of the 8-64 rows of a decode
step reads that layout 1.2-1.6x faster than ``F.linear`` reads the row-major weight. The
result is the same matrix product, rounded differently in the last bits (a different
order of additions), so tests compare tokens, not logits bit for bit.

The fused copies are made once per model (``fused_weights``) and shared by every runner of
it; the Hugging Face model keeps its own weights for ``generate``. Not handled: weights
changed after the first runner was made (make a new model), quantized weights.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# oneDNN picks its blocked layout for an expected number of rows; any number still works.
_EXPECTED_ROWS = 32


class FusedLinear:
    """``y = x @ W.T + b`` for one or more ``nn.Linear`` that read the same input.

    Args:
        linears: the layers, in the order their outputs sit side by side in ``y``.
        onednn: reorder the weight for oneDNN; None does so where it applies (float32 on
            a CPU that has oneDNN).
    """

    def __init__(self, linears: Sequence[nn.Linear], onednn: bool | None = None):
        with torch.no_grad():
            weight = torch.cat([linear.weight for linear in linears])  # (sum out, in)
            biases = [linear.bias for linear in linears]
            bias = None if biases[0] is None else torch.cat(biases)
        self.out_features = [linear.out_features for linear in linears]
        self.bias = bias
        applies = _onednn_applies(weight)
        if onednn and not applies:
            raise ValueError(
                f"onednn=True needs float32 weights on a CPU with oneDNN, got "
                f"{weight.dtype} on {weight.device.type}"
                f"{'' if torch.backends.mkldnn.is_available() else ' (no oneDNN in this torch)'}"
            )
        self.onednn = applies if onednn is None else onednn
        self.weight = (
            torch.ops.mkldnn._reorder_linear_weight(weight, _EXPECTED_ROWS)
            if self.onednn
            else weight
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, in) -> (num_tokens, sum of out_features)
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The output of each fused layer: ``(q, k, v)`` or ``(gate, up)``."""
        return self(x).split(self.out_features, dim=-1)


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's matrices, fused."""

    qkv_proj: FusedLinear
    o_proj: FusedLinear
    gate_up_proj: FusedLinear
    down_proj: FusedLinear


@dataclass(frozen=True)
class ModelWeights:
    """Every layer's fused matrices and the LM head, made once per model."""

    layers: list[LayerWeights]
    lm_head: FusedLinear

    @property
    def onednn(self) -> bool:
        return self.lm_head.onednn


# model -> {(device, dtype, onednn): ModelWeights}; an entry goes when its model goes.
_made: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fused_weights(hf_model, onednn: bool | None = None) -> ModelWeights:
    """The fused weights of a ``*ForCausalLM``, made on first use and kept while it lives.

    Args:
        hf_model: the model; made again after it moves to another device or dtype.
        onednn: as for ``FusedLinear``.
    """
    head = hf_model.lm_head.weight
    key = (head.device, head.dtype, onednn)
    # Copies for a device or dtype the model has left would only hold memory.
    made = {k: v for k, v in _made.get(hf_model, {}).items() if k[:2] == key[:2]}
    _made[hf_model] = made
    if key not in made:
        made[key] = _fuse(hf_model, onednn)
    return made[key]


def _fuse(hf_model, onednn: bool | None) -> ModelWeights:
    layers = []
    for layer in hf_model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layers.append(
            LayerWeights(
                qkv_proj=FusedLinear([attn.q_proj, attn.k_proj, attn.v_proj], onednn),
                o_proj=FusedLinear([attn.o_proj], onednn),
                gate_up_proj=FusedLinear([mlp.gate_proj, mlp.up_proj], onednn),
                down_proj=FusedLinear([mlp.down_proj], onednn),
            )
        )
    return ModelWeights(layers, FusedLinear([hf_model.lm_head], onednn))


def _onednn_applies(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
    )
