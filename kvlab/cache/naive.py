"""The naive KV cache: one growing tensor per sequence, as Hugging Face's ``DynamicCache`` does.

Every step concatenates the new keys and values onto each sequence's tensors. Nothing is
reserved ahead, so nothing is wasted inside the cache, but each ``torch.cat`` copies the whole
context (quadratic copying over a generation), memory is allocated piecemeal by the
framework, and a server has no way to know ahead whether the next request still fits. Lab 01
measures this cache; labs 02 and 03 replace it with one preallocated pool.

Not handled: a memory limit (it grows until the device runs out), sharing between sequences.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvlab.cache.base import CacheUsage, KVCache, StepMetadata


class NaiveKVCache(KVCache):
    """Per-sequence, per-layer K and V tensors of shape (num_tokens, num_kv_heads, head_dim)."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int):
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self._keys: dict[int, list[torch.Tensor | None]] = {}
        self._values: dict[int, list[torch.Tensor | None]] = {}
        self._num_tokens: dict[int, int] = {}

    def add_request(
        self, seq_id: int, prompt_token_ids: Sequence[int], max_tokens: int | None = None
    ) -> int:
        """Register ``seq_id`` with no tokens yet: nothing is reserved, nothing is cached."""
        if seq_id in self._num_tokens:
            raise ValueError(f"seq {seq_id} already exists")
        self._keys[seq_id] = [None] * self.num_layers
        self._values[seq_id] = [None] * self.num_layers
        self._num_tokens[seq_id] = 0
        return 0

    def allocate_slots(
        self, seq_id: int, num_new_tokens: int, token_ids: Sequence[int] | None = None
    ) -> None:
        """Count ``num_new_tokens`` more; the tensors grow when they are written."""
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be > 0, got {num_new_tokens}")
        if seq_id not in self._num_tokens:
            self.add_request(seq_id, ())
        self._num_tokens[seq_id] += num_new_tokens

    def free(self, seq_id: int) -> None:
        self._check_known(seq_id)
        del self._keys[seq_id], self._values[seq_id], self._num_tokens[seq_id]

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._num_tokens

    def num_tokens(self, seq_id: int) -> int:
        self._check_known(seq_id)
        return self._num_tokens[seq_id]

    def write(self, layer: int, meta: StepMetadata, key: torch.Tensor, value: torch.Tensor) -> None:
        batch = meta.batch
        starts = batch.query_start_loc.tolist()
        for i, seq_id in enumerate(batch.seq_ids):
            rows = slice(starts[i], starts[i + 1])
            self._keys[seq_id][layer] = _append(self._keys[seq_id][layer], key[rows])
            self._values[seq_id][layer] = _append(self._values[seq_id][layer], value[rows])

    def read(self, layer: int, meta: StepMetadata, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        seq_id = meta.batch.seq_ids[index]
        return self._keys[seq_id][layer], self._values[seq_id][layer]

    def usage(self) -> CacheUsage:
        held = sum(
            t.numel() * t.element_size()
            for tensors in (*self._keys.values(), *self._values.values())
            for t in tensors
            if t is not None
        )
        return CacheUsage(capacity_bytes=held, reserved_bytes=held, used_bytes=held)

    def _check_known(self, seq_id: int) -> None:
        if seq_id not in self._num_tokens:
            raise KeyError(f"seq_id {seq_id} holds nothing in this cache")


def _append(cached: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    return new.clone() if cached is None else torch.cat([cached, new], dim=0)
