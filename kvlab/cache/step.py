"""One step, as the runner, the cache and attention see it: the batch and its metadata.

Token layout in a step (varlen, as in vLLM): the new tokens of all sequences are packed
into one flat batch of ``num_tokens``; sequence ``i`` owns rows
``query_start_loc[i]:query_start_loc[i+1]``.

    seq 0: |---- context (cached) ----|== new ==|
    seq 1: |-- context --|===== new (prefill) =====|
                                  seq_lens[i] = context + new

``ForwardBatch`` is that layout, made from the scheduler's plan. ``StepMetadata`` adds
where the K/V of those tokens live, built once per step by the cache
(``KVCache.begin_step``) and handed to every write, read and attention call of every
layer; no backend keeps state of its own between calls.

    block_table   (num_seqs, max_blocks) int32: physical block of each logical block,
                  padded with 0 (never read: seq_lens bounds every read). A contiguous
                  cache's blocks are single slots, so its rows are consecutive slots.
    slot_mapping  (num_tokens,) int64: slot = block_id * block_size + offset, per new token

Not handled here: how a cache fills these in (``kvlab.cache.paged``,
``kvlab.cache.contiguous``), attention itself (``kvlab.attention``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass
class ForwardBatch:
    """What one forward step computes: which sequences, and which of their tokens.

    Attributes:
        seq_ids: the requests in this step, in row order.
        query_start_loc: (num_seqs + 1,) offsets of each sequence's new tokens in the flat batch.
        seq_lens: (num_seqs,) tokens each sequence holds after this step (context + new).
        positions: (num_tokens,) position of every new token in its sequence.
    """

    seq_ids: list[int]
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    positions: torch.Tensor

    @classmethod
    def build(cls, seq_ids: list[int], num_computed: list[int], num_new: list[int], device=None):
        """Pack sequences that already hold ``num_computed`` tokens and add ``num_new`` each.

        No Python loop over tokens: a decode step's positions are ``num_computed`` itself,
        a mixed step's are each sequence's ``num_computed + 0, 1, ...``, made with tensor ops.
        """
        if not (len(seq_ids) == len(num_computed) == len(num_new)):
            raise ValueError("seq_ids, num_computed and num_new must have the same length")
        if any(n <= 0 for n in num_new):
            raise ValueError(f"every sequence must bring at least one new token, got {num_new}")
        computed = torch.tensor(num_computed, dtype=torch.long)
        new = torch.tensor(num_new, dtype=torch.long)
        query_start_loc = torch.zeros(len(num_new) + 1, dtype=torch.long)
        torch.cumsum(new, 0, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        if num_tokens == len(num_new):
            positions = computed
        else:
            # token j of the flat batch belongs to sequence i: position = computed[i] + j - start[i]
            offsets = torch.repeat_interleave(computed - query_start_loc[:-1], new)
            positions = torch.arange(num_tokens) + offsets
        return cls(
            seq_ids=list(seq_ids),
            query_start_loc=query_start_loc.to(device),
            seq_lens=(computed + new).to(device),
            positions=positions.to(device),
        )

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc[-1])

    @property
    def is_decode(self) -> bool:
        """Every sequence brings exactly one new token."""
        return self.num_tokens == self.num_seqs


@dataclass(frozen=True)
class DecodeSplit:
    """A step's rows split for batched attention: one-query rows together, the rest apart.

    Attributes:
        decode_index: (num_decodes,) index of each one-query sequence in the batch.
        decode_rows: (num_decodes,) its query's row in the flat batch.
        key_mask: (num_decodes, 1, 1, max_seq_len) True where a key belongs to the sequence.
        max_seq_len: the longest context among them.
        prefill: ``(index, start, end)`` of every sequence with more than one new token.
        block_ids: (num_decodes * max_blocks,) int64, the blocks that hold the first
            ``max_seq_len`` tokens of each one-query sequence, row after row; None without
            a block table.
        seq_lens: (num_decodes,) int64, the tokens each one-query sequence holds.
    """

    decode_index: torch.Tensor
    decode_rows: torch.Tensor
    key_mask: torch.Tensor | None
    max_seq_len: int
    prefill: list[tuple[int, int, int]]
    block_ids: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None

    @property
    def all_decode(self) -> bool:
        """Every row of the step is a one-query row (no prefill)."""
        return not self.prefill


@dataclass(frozen=True)
class StepMetadata:
    """Everything the layers of one step need to find K/V; built once by ``begin_step``.

    Attributes:
        batch: the layout of the step's tokens.
        block_table: (num_seqs, max_blocks) int32 on the cache's device; None for a cache
            without a pool (the naive cache).
        slot_mapping: (num_tokens,) int64, the slot of each new token's K/V; None likewise.
        block_size: slots per block of ``block_table`` (1 for a contiguous cache).
    """

    batch: ForwardBatch
    block_table: torch.Tensor | None = None
    slot_mapping: torch.Tensor | None = None
    block_size: int = 1

    @cached_property
    def decode_split(self) -> DecodeSplit:
        """Which rows decode (one query each) and which prefill; computed once per step."""
        batch = self.batch
        starts = batch.query_start_loc.tolist()
        decodes, prefill = [], []
        for i in range(batch.num_seqs):
            if starts[i + 1] - starts[i] == 1:
                decodes.append(i)
            else:
                prefill.append((i, starts[i], starts[i + 1]))
        device = batch.query_start_loc.device
        index = torch.tensor(decodes, dtype=torch.long, device=device)
        rows = torch.tensor([starts[i] for i in decodes], dtype=torch.long, device=device)
        if not decodes:
            return DecodeSplit(index, rows, None, 0, prefill)
        lens = batch.seq_lens[index]
        max_seq_len = int(lens.max())
        positions = torch.arange(max_seq_len, device=device)
        mask = (positions[None, :] < lens[:, None])[:, None, None, :]  # (N, 1, 1, L)
        block_ids = None
        if self.block_table is not None:
            max_blocks = -(-max_seq_len // self.block_size)
            block_ids = self.block_table[index, :max_blocks].flatten().long()
        return DecodeSplit(index, rows, mask, max_seq_len, prefill, block_ids, lens)
