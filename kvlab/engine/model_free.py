"""A stand-in for the model: the engine's serving loop with no forward pass.

``LLMEngine.step`` is schedule -> allocate -> metadata -> forward -> sample -> free. With
``ModelFreeRunner`` in place of ``kvlab.model.runner.ModelRunner`` all of it runs for real
except the forward pass: the runner still asks the cache for the step's metadata (block
table and slot mapping), as the model would, and then predicts token 0 for every
sequence. Give each request ``max_tokens`` = its output length and ``ignore_eos=True``,
and a trace's lengths replay exactly, through the one loop every lab uses.

    real model:   logits = ModelRunner.forward(input_ids, batch, cache)   (num_seqs, vocab)
    model-free:   cache.begin_step(batch); logits = zeros(num_seqs, 2)     token 0 wins

A request may also end *before* its ``max_tokens``, as a chat model's answer ends at EOS:
``runner.stop_after(seq_id, prompt_len, n)`` makes that sequence's n-th token the runner's
``EOS`` (token 1). Run the engine with ``eos_token_id=ModelFreeRunner.EOS`` and the request
declares ``max_tokens`` (what a contiguous cache reserves) but stops at its true length,
as labs 02 and 03 need to measure reservations against real output lengths.

A cache made with ``num_layers=0`` holds no K/V tensors at all (``bookkeeping_cache``):
only its manager, so a pool of an A100's size costs nothing to simulate.

Used by: the benchmark of the engine's own cost per step (``kvlab.measure.engine_overhead``),
the allocator labs' concurrency search (``kvlab.measure.experiments.max_concurrency``),
lab 04's and lab 07's graders, and the simulator's equivalence test. Not handled: anything
that depends on token values (prefix-cache hits need prompts that share tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlab.cache.base import ForwardBatch, PooledKVCache
from kvlab.cache.contiguous import ContiguousKVCache
from kvlab.cache.paged import PagedKVCache


@dataclass(frozen=True)
class ModelFreeConfig:
    """The two things the engine reads from a model's config."""

    vocab_size: int
    max_position_embeddings: int


class ModelFreeRunner:
    """Runs no model: builds the step's metadata, then predicts token 0 for every sequence
    (or ``EOS``, token 1, where ``stop_after`` says a sequence ends).

    Args:
        vocab_size: token ids a prompt may use (the engine checks prompts against it).
        max_model_len: the longest sequence a request may reach.
    """

    EOS = 1

    def __init__(self, vocab_size: int = 50_000, max_model_len: int = 1 << 20) -> None:
        self.config = ModelFreeConfig(vocab_size, max_model_len)
        self.device = torch.device("cpu")
        self._eos_at: dict[int, int] = {}  # seq_id -> its seq_len in the step that samples EOS

    def stop_after(self, seq_id: int, prompt_len: int, num_output_tokens: int) -> None:
        """Make ``seq_id``'s ``num_output_tokens``-th output token ``EOS``.

        The k-th output token is sampled in the step that computes position
        ``prompt_len + k - 2`` (the prompt's last token for k = 1), whether the sequence
        got there by decoding or by recomputing after a preemption.
        """
        if num_output_tokens < 1:
            raise ValueError(f"num_output_tokens={num_output_tokens!r} is not allowed: use >= 1")
        self._eos_at[seq_id] = prompt_len + num_output_tokens - 1

    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch, cache) -> torch.Tensor:
        """(num_seqs, 2) logits: token 0 wins, unless the sequence ends here (``EOS``)."""
        cache.begin_step(batch)  # the metadata a model's attention would read
        logits = torch.zeros(batch.num_seqs, 2)
        if self._eos_at:
            seq_lens = batch.seq_lens.tolist()
            for row, seq_id in enumerate(batch.seq_ids):
                if self._eos_at.get(seq_id) == seq_lens[row]:
                    logits[row, self.EOS] = 1.0
        return logits


def bookkeeping_cache(
    kind: str = "paged", *, num_blocks: int = 0, block_size: int = 16, num_slots: int = 0, **kwargs
) -> PooledKVCache:
    """A paged (``num_blocks`` of ``block_size``) or contiguous (``num_slots``) cache that
    keeps the bookkeeping and no K/V tensors."""
    kwargs.setdefault("device", "cpu")
    if kind == "paged":
        return PagedKVCache(0, 1, 1, num_blocks=num_blocks, block_size=block_size, **kwargs)
    if kind == "contiguous":
        return ContiguousKVCache(0, 1, 1, num_slots=num_slots, **kwargs)
    raise ValueError(f"kind={kind!r} is not allowed: use 'paged' or 'contiguous'")
