"""kvlab's own forward pass for Llama-family decoders, reading and writing K/V through a cache.

It takes the weights of a Hugging Face model (Llama, Mistral, Qwen2, SmolLM) and runs them
itself, so that where K and V live is kvlab's choice: the runner only talks to a ``KVCache``
(``kvlab.cache.base``). One step, for a flat batch of new tokens from several sequences:

    meta = cache.begin_step(batch)      # block table, slot mapping: once per step
    embed tokens
    for each layer:
        h = RMSNorm(x)
        q, k, v = qkv_proj(h)           # one fused matmul; k, v: (tokens, kv_heads, head_dim)
        q, k = rotate(q, k, positions)  # rotary position embedding
        cache.write(layer, meta, k, v)  # the KV cache: store this step's keys and values
        a = attention(q, layer, meta, cache)  # every sequence attends to its whole context
        x = x + o_proj(a)
        x = x + MLP(RMSNorm(x))         # SwiGLU: gate and up in one fused matmul
    logits = lm_head(RMSNorm(x)) at each sequence's last token

The matrices are the model's own, fused and laid out once for speed (``kvlab.model.linear``).

Not handled: sliding-window attention, dynamic RoPE scaling that changes with length,
mixture-of-experts, tensor parallelism.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvlab.attention import ATTENTION_BACKENDS, AttentionFn
from kvlab.cache.base import ForwardBatch, KVCache
from kvlab.memory import KVSpec
from kvlab.model.linear import fused_weights


class ModelRunner:
    """Runs a Hugging Face Llama-family model's weights with kvlab's cache interface.

    Args:
        hf_model: a loaded ``*ForCausalLM`` (see ``kvlab.load_model``); its weights are
            shared, not copied.
        attention: the attention backend: ``"reference"`` (one sequence at a time, any
            cache), ``"sdpa"`` (decode rows batched), ``"triton"`` (kvlab's kernels),
            ``"cpu"`` (kvlab's C decode kernel), or a function with the signature of
            ``kvlab.attention.reference_attention``.
        onednn: lay float32 CPU weights out for oneDNN (see ``kvlab.model.linear``); None
            does so where it applies, False keeps them row-major.
    """

    def __init__(
        self, hf_model, attention: str | AttentionFn = "reference", onednn: bool | None = None
    ):
        config = hf_model.config
        self.config = config
        self.model = hf_model.model
        self.lm_head = hf_model.lm_head
        self.weights = fused_weights(hf_model, onednn)
        self.attention = _attention_backend(attention)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.scale = self.head_dim**-0.5
        self.eps = config.rms_norm_eps
        # The config's RoPE variant (default, linear, llama3, yarn, ...) is already folded into
        # the inverse frequencies and the output scaling that transformers computed at load.
        rotary = self.model.rotary_emb
        self.inv_freq = rotary.inv_freq
        self.rope_scaling = float(rotary.attention_scaling)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def kv_spec(self) -> KVSpec:
        """This model's KV-cache shape (for sizing caches)."""
        return KVSpec.from_config(self.config, dtype=self.dtype)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch, cache: KVCache) -> torch.Tensor:
        """One step: the new tokens of every sequence in ``batch`` through all layers.

        Args:
            input_ids: (num_tokens,) new token ids, packed as ``batch.query_start_loc`` says.
            batch: which sequences run and where their new tokens sit.
            cache: must already have room for these tokens (``allocate_slots``).

        Returns:
            (num_seqs, vocab_size) logits at each sequence's last new token.
        """
        meta = cache.begin_step(batch)
        x = self.model.embed_tokens(input_ids)  # (num_tokens, hidden)
        cos, sin = self.rotary(batch.positions)  # (num_tokens, head_dim)
        layers = zip(self.model.layers, self.weights.layers, strict=True)
        for index, (layer, weights) in enumerate(layers):
            x = x + self._attention_block(layer, weights, index, x, cos, sin, meta, cache)
            x = x + self._mlp_block(layer, weights, x)
        last_rows = batch.query_start_loc[1:] - 1
        x = rms_norm(x[last_rows], self.model.norm.weight, self.eps)
        return self.weights.lm_head(x)

    def _attention_block(self, layer, weights, index, x, cos, sin, meta, cache):
        h = rms_norm(x, layer.input_layernorm.weight, self.eps)
        num_tokens = h.shape[0]
        # Project, then split the hidden vector into heads: (num_tokens, heads, head_dim).
        qkv = weights.qkv_proj(h)  # (num_tokens, (heads + 2 kv_heads) * head_dim)
        num_qk_heads = self.num_heads + self.num_kv_heads
        qk = qkv[:, : num_qk_heads * self.head_dim].view(num_tokens, num_qk_heads, self.head_dim)
        v = qkv[:, num_qk_heads * self.head_dim :].view(num_tokens, -1, self.head_dim)
        # Rotate q and k by their positions, side by side in one pass; v carries no position.
        qk = apply_rotary(qk, cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        # The KV cache at work: store k and v, then attend over everything stored so far.
        cache.write(index, meta, k, v)
        out = self.attention(q, index, meta, cache, self.scale)
        return weights.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))

    def _mlp_block(self, layer, weights, x):
        h = rms_norm(x, layer.post_attention_layernorm.weight, self.eps)
        gate, up = weights.gate_up_proj.split(h)
        return weights.down_proj(F.silu(gate) * up)

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) of every position's rotary angles, each (num_tokens, head_dim)."""
        freqs = positions[:, None].float() * self.inv_freq[None, :].float()
        angles = torch.cat([freqs, freqs], dim=-1)  # (num_tokens, head_dim)
        cos = (angles.cos() * self.rope_scaling).to(self.dtype)
        sin = (angles.sin() * self.rope_scaling).to(self.dtype)
        return cos, sin


def _attention_backend(attention: str | AttentionFn) -> AttentionFn:
    if callable(attention):
        return attention
    if attention not in ATTENTION_BACKENDS:
        raise ValueError(
            f"attention must be one of {sorted(ATTENTION_BACKENDS)} or a function, "
            f"got {attention!r}"
        )
    return ATTENTION_BACKENDS[attention]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalize in float32 (as transformers does), then scale in the model's dtype.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (num_tokens, heads, head_dim); rotate pairs (i, i + head_dim/2).
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
