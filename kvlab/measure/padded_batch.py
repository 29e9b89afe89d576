"""Lab 01's padded batch: ``model.generate`` on several prompts at once, and its cache.

transformers batches prompts of different lengths by padding them on the left to the
longest, and keeps every request in the batch until the longest answer ends. The cache it
leaves behind holds every row at the batch's longest length; this module runs such a batch
on a real model and accounts for every cache slot: left padding, prompt, generated token,
or padding after the request's EOS, at the end or after any step. Lab 01 animates it step
by step, lab 03 uses ``generate_padded`` as its oracle, and the benchmark pads its Hugging
Face baseline the same way (``left_pad``).

Not handled: right padding, packed (unpadded) batches (kvlab's engine packs, lab 04).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import GenerationConfig

from kvlab.measure.naive_hf import cache_bytes, cache_layer_shapes
from kvlab.memory import KVSpec

# Slot kinds of a padded batch's cache, one per (request, position); see PaddedBatch.slot_kinds.
LEFT_PAD, PROMPT, GENERATED, FINISHED_PAD = 0, 1, 2, 3
SLOT_KIND_NAMES = ("left padding", "prompt", "generated", "padding after EOS")


@dataclass(frozen=True)
class PaddedBatch:
    """A batch that ``model.generate`` ran left-padded, and the cache it left behind.

    transformers pads every prompt on the left to the longest one, and keeps every
    request in the batch (fed with padding after its EOS) until the longest answer ends.
    At the end each row of the cache holds ``max(prompt_lens) + max(output_lens) - 1``
    positions: the last generated token never went through the model.

        request 0: |pad pad|prompt........|gen gen gen gen EOS pad pad|
        request 1: |prompt................|gen gen gen gen gen gen gen|
                    ^ left padding          ^ padding after EOS ^

    Attributes:
        prompt_lens: prompt tokens per request.
        outputs: generated tokens per request, up to and including its EOS.
        cache_shape: (batch, num_kv_heads, seq_len, head_dim) of each K and V tensor.
        cache_bytes: bytes of the whole cache, counted from its tensors.
        bytes_per_token: K/V bytes of one position of one request (all layers).
    """

    prompt_lens: list[int]
    outputs: list[list[int]]
    cache_shape: tuple[int, ...]
    cache_bytes: int
    bytes_per_token: int

    @property
    def output_lens(self) -> list[int]:
        return [len(output) for output in self.outputs]

    @property
    def num_slots(self) -> int:
        """Positions the cache holds: batch x its padded length."""
        return self.cache_shape[0] * self.cache_shape[2]

    @property
    def num_real_tokens(self) -> int:
        """Positions that hold a token some request needs."""
        return padded_cache_slots(self.prompt_lens, self.output_lens)[1]

    @property
    def waste(self) -> float:
        """Fraction of the cache's positions that hold padding."""
        return 1 - self.num_real_tokens / self.num_slots

    @property
    def num_steps(self) -> int:
        """Steps the batch ran: the prefill, then one decode step per token of the longest
        answer but its last."""
        return max(self.output_lens)

    def slot_kinds(self, after_step: int | None = None) -> list[list[int]]:
        """What each (request, position) of the cache holds: LEFT_PAD, PROMPT, GENERATED...

        Args:
            after_step: the cache after this step (0: the prefill, which holds the padded
                prompts; step ``t`` adds one position to every row); None: at the end.
        """
        last = self.num_steps - 1
        step = last if after_step is None else after_step
        if not 0 <= step <= last:
            raise ValueError(f"after_step={after_step} outside the batch's steps 0..{last}")
        width = max(self.prompt_lens)
        rows = []
        for prompt_len, output_len in zip(self.prompt_lens, self.output_lens, strict=True):
            fed = min(step, output_len - 1)  # generated tokens fed back so far
            row = [LEFT_PAD] * (width - prompt_len) + [PROMPT] * prompt_len + [GENERATED] * fed
            rows.append(row + [FINISHED_PAD] * (step - fed))
        return rows

    def padding_per_request(self) -> list[tuple[int, int]]:
        """(left padding, padding after EOS) of each request's row, in positions."""
        return [(row.count(LEFT_PAD), row.count(FINISHED_PAD)) for row in self.slot_kinds()]


def padded_cache_slots(prompt_lens: Sequence[int], output_lens: Sequence[int]) -> tuple[int, int]:
    """(positions a left-padded batch's cache holds, positions that hold real tokens).

    Every row is as long as the longest prompt plus the longest output, less one (the last
    generated token is never fed back); request ``i`` needs ``prompt_lens[i] +
    output_lens[i] - 1`` of them.
    """
    if len(prompt_lens) != len(output_lens) or not prompt_lens:
        raise ValueError("prompt_lens and output_lens must be non-empty and of equal length")
    if min(prompt_lens) <= 0 or min(output_lens) <= 0:
        raise ValueError("every request needs at least one prompt and one output token")
    seq_len = max(prompt_lens) + max(output_lens) - 1
    real = sum(p + o - 1 for p, o in zip(prompt_lens, output_lens, strict=True))
    return len(prompt_lens) * seq_len, real


@torch.inference_mode()
def left_pad(
    prompts: Sequence[Sequence[int]], pad_token_id: int = 0, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch as Hugging Face ``generate`` takes it: prompts padded on the left to the
    longest, and an attention mask that is 0 on the padding. Returns (input_ids, mask)."""
    width = max(len(p) for p in prompts)
    ids = [[pad_token_id] * (width - len(p)) + list(p) for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return torch.tensor(ids, device=device), torch.tensor(mask, device=device)


def generate_padded(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
) -> PaddedBatch:
    """Greedy ``model.generate`` on left-padded ``prompts``; return outputs and the cache."""
    ids, mask = left_pad(prompts, pad_token_id)
    width = ids.shape[1]
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        return_dict_in_generate=True,
    )
    out = model.generate(
        ids.to(model.device), attention_mask=mask.to(model.device), generation_config=config
    )
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    outputs = [_cut_after(row, eos_token_id) for row in out.sequences[:, width:].tolist()]
    spec = KVSpec.from_config(model.config, dtype=model.dtype)
    return PaddedBatch(
        prompt_lens=[len(p) for p in prompts],
        outputs=outputs,
        cache_shape=cache_layer_shapes(cache)[0][0],
        cache_bytes=cache_bytes(cache),
        bytes_per_token=spec.bytes_per_token,
    )


def _cut_after(tokens: list[int], eos_token_id: int) -> list[int]:
    if eos_token_id in tokens:
        return tokens[: tokens.index(eos_token_id) + 1]
    return tokens
