"""Greedy generation for a fixed batch of prompts with kvlab's runner and any KV cache.

This is the simplest loop that uses a KV cache: one prefill step computes every prompt's
K/V, then each decode step feeds one new token per unfinished sequence and reads the rest
from the cache. All sequences start together and the batch only shrinks (no new requests
join): scheduling and batching policies come with ``kvlab.engine.llm_engine``.

Not handled: sampling (see the engine), stop strings, admission control.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kvlab.cache.base import ForwardBatch, KVCache
from kvlab.model.runner import ModelRunner

StepCallback = Callable[[int, KVCache], None]


def greedy_generate(
    runner: ModelRunner,
    cache: KVCache,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_token_id: int | None = None,
    on_step: StepCallback | None = None,
) -> list[list[int]]:
    """Generate greedily for every prompt; return each prompt's new token ids.

    Args:
        prompts: token ids per prompt (any lengths).
        max_new_tokens: tokens to generate per prompt (fewer when ``eos_token_id`` comes).
        on_step: called after every step with (step index, cache), e.g. to redraw a widget.
    """
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be > 0, got {max_new_tokens}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    outputs: list[list[int]] = [[] for _ in prompts]
    active = list(range(len(prompts)))
    pending = [list(p) for p in prompts]  # tokens each sequence must feed next
    seq_ids = list(range(len(prompts)))
    step = 0
    try:
        while active:
            next_tokens = _step(
                runner, cache, [seq_ids[i] for i in active], [pending[i] for i in active]
            )
            for i, token in zip(list(active), next_tokens, strict=True):
                outputs[i].append(token)
                pending[i] = [token]
                if len(outputs[i]) == max_new_tokens or token == eos_token_id:
                    active.remove(i)
                    cache.free(seq_ids[i])
            if on_step is not None:
                on_step(step, cache)
            step += 1
    finally:
        # On an error (a full cache, say) free what the unfinished sequences hold; a
        # sequence refused at its first allocation holds nothing.
        for i in active:
            if seq_ids[i] in cache:
                cache.free(seq_ids[i])
    return outputs


def _step(runner: ModelRunner, cache: KVCache, seq_ids: list[int], new_tokens: list[list[int]]):
    """Allocate room, run one forward step, and pick each sequence's most likely next token."""
    num_computed = []
    for seq_id, tokens in zip(seq_ids, new_tokens, strict=True):
        num_computed.append(cache.num_tokens(seq_id) if seq_id in cache else 0)
        cache.allocate_slots(seq_id, len(tokens))
    batch = ForwardBatch.build(
        seq_ids, num_computed, [len(t) for t in new_tokens], device=runner.device
    )
    input_ids = torch.tensor([t for tokens in new_tokens for t in tokens], device=runner.device)
    logits = runner.forward(input_ids, batch, cache)
    return logits.argmax(dim=-1).tolist()
