"""KV-cache arithmetic: how many bytes one token, one request and one batch hold.

Every layer keeps a key and a value vector per KV head for every token, so

    bytes per token = 2 (K and V) x num_layers x num_kv_heads x head_dim x bytes per element

The seed article's example multiplies the parameter count instead ("10 x (7B x 2 x 4096 x
2B)"); lab 01 puts both side by side. Presets cover the models the labs talk about.

Not handled: sliding-window or cross-layer KV sharing, quantized KV caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GIB = 2**30
MIB = 2**20


@dataclass(frozen=True)
class KVSpec:
    """The shape of one model's KV cache, and its weight count for memory budgets.

    Attributes:
        name: a label for tables and plots.
        num_layers: decoder layers; each keeps its own K and V.
        num_kv_heads: key/value heads (fewer than query heads under grouped-query attention).
        head_dim: size of one head's key (and value) vector.
        dtype_bytes: bytes per element (2 for float16/bfloat16, 4 for float32).
        num_params: weight count, used to split device memory into weights and KV.
        max_model_len: the longest sequence (prompt + output) the model accepts.
    """

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    num_params: int
    max_model_len: int

    def __post_init__(self) -> None:
        for field in ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes", "max_model_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"KVSpec.{field} must be a positive int, got {value!r}")

    @property
    def bytes_per_token(self) -> int:
        """K and V bytes that one token occupies across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def bytes_for(self, num_tokens: int) -> int:
        """KV bytes of a request (or batch) holding ``num_tokens`` tokens."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return self.bytes_per_token * num_tokens

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights at this spec's dtype."""
        return self.num_params * self.dtype_bytes

    def with_dtype(self, dtype: torch.dtype) -> KVSpec:
        """The same model with its KV stored in ``dtype``."""
        return KVSpec(
            self.name,
            self.num_layers,
            self.num_kv_heads,
            self.head_dim,
            _dtype_bytes(dtype),
            self.num_params,
            self.max_model_len,
        )

    @classmethod
    def from_config(cls, config, dtype: torch.dtype = torch.float32, name: str = "") -> KVSpec:
        """Read the KV shape from a Hugging Face config (Llama, Mistral, Qwen2, ...)."""
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        return cls(
            name=name or getattr(config, "_name_or_path", "") or config.model_type,
            num_layers=config.num_hidden_layers,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            dtype_bytes=_dtype_bytes(dtype),
            num_params=_count_params(config),
            max_model_len=config.max_position_embeddings,
        )


def _dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _count_params(config) -> int:
    """Weights of a Llama-family decoder, counted from its config."""
    hidden, inter, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // num_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    attention = hidden * head_dim * (2 * num_heads + 2 * num_kv_heads)
    if config.model_type == "qwen2" or getattr(config, "attention_bias", False):
        attention += head_dim * (num_heads + 2 * num_kv_heads)  # q, k and v biases
    mlp = 3 * hidden * inter
    per_layer = attention + mlp + 2 * hidden
    embeddings = vocab * hidden * (1 if config.tie_word_embeddings else 2)
    return config.num_hidden_layers * per_layer + embeddings + hidden


# Published shapes (each model's config.json); fp16 KV as served on GPUs.
PRESETS: dict[str, KVSpec] = {
    spec.name: spec
    for spec in (
        KVSpec("llama-2-7b", 32, 32, 128, 2, 6_738_415_616, 4096),
        KVSpec("llama-2-13b", 40, 40, 128, 2, 13_015_864_320, 4096),
        KVSpec("llama-3-8b", 32, 8, 128, 2, 8_030_261_248, 8192),
        KVSpec("smollm2-135m", 30, 3, 64, 4, 134_515_008, 8192),
    )
}


def preset(name: str) -> KVSpec:
    """A preset by name; the error lists the names that exist."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown KV preset {name!r}; choose one of {sorted(PRESETS)}") from None
