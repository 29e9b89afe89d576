"""Lab 03's build-it in the real engine: a learner's block manager hands out every block.

``check_generation`` serves SmolLM2 requests (one with two samples, so ``fork`` and
copy-on-write run) through a ``PagedKVCache`` whose bookkeeping is the learner's manager
(``LearnerBlockManager``) and through kvlab's own, side by side (``run_side_by_side``): a
shared block written in place, or a block handed out while still held, shows at the step
it happens.

Not handled: prefix caching (``plan_admission`` finds nothing cached), swapping.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from kvlab.cache.manager import KVCacheManager, KVUsage, not_held_error
from kvlab.exercises.grading import (
    Verdict,
    different_requests,
    engine_stopped,
    model_and_prompts,
    one_torch_thread,
)


def check_generation(manager_class, model=None, prompts=None) -> Verdict:
    """Serve prompts with the learner's manager handing out every block, against kvlab's."""
    from kvlab.cache.paged import PagedKVCache
    from kvlab.engine.llm_engine import LLMEngine
    from kvlab.engine.sampling_params import SamplingParams
    from kvlab.engine.scheduler_config import SchedulerConfig
    from kvlab.model.runner import ModelRunner

    model, prompts = model_and_prompts(model, prompts)
    runner = ModelRunner(model, attention="sdpa")
    spec = runner.kv_spec()
    # Two samples of the first prompt share its blocks (fork) until each writes its own
    # first token into the shared, partly filled last block (copy-on-write).
    params = [SamplingParams(n=2, temperature=0.8, seed=7, max_tokens=10)] + [
        SamplingParams(temperature=0, max_tokens=10) for _ in prompts[1:]
    ]
    # A pool too small for every request at once, so that the engine preempts one
    # (recompute): its blocks are freed, and it comes back later under the same seq_id.
    num_blocks = pool_that_preempts(prompts, max_tokens=10, block_size=4)
    try:
        with one_torch_thread():
            engines = {}
            learner = LearnerBlockManager(manager_class, num_blocks, 4)
            options = dict(block_size=4, device="cpu", enable_prefix_caching=False)
            for name, manager in (("yours", learner), ("kvlab", None)):
                cache = PagedKVCache.from_spec(spec, num_blocks, manager=manager, **options)
                engines[name] = LLMEngine(runner, cache, SchedulerConfig(max_num_seqs=4))
                for index, (prompt, param) in enumerate(zip(prompts, params, strict=True)):
                    engines[name].add_request(str(index), prompt, param)
            failure = run_side_by_side(engines["yours"], engines["kvlab"], len(prompts))
    except Exception as error:  # noqa: BLE001 - the learner's manager inside the engine
        return engine_stopped(error)
    preempted = engines["kvlab"].metrics.num_preemptions
    detail = (
        f"{len(prompts)} requests, {len(prompts) + 1} samples, {preempted} preempted and "
        "resumed, every step's K/V and every token as with kvlab's BlockManager"
    )
    return failure or Verdict("generation", True, detail)


def pool_that_preempts(prompts: Sequence[Sequence[int]], max_tokens: int, block_size: int) -> int:
    """Fewer blocks than the prompts fill: the engine must preempt to finish them, yet the
    largest request, with its two samples, fits alone."""

    def blocks(n: int) -> int:
        return -(-n // block_size)

    largest = max(blocks(len(p) + max_tokens) for p in prompts)
    return max(sum(blocks(len(p)) for p in prompts) - 4, largest + blocks(max_tokens) + 1)


def run_side_by_side(yours, kvlab, num_requests: int) -> Verdict | None:
    """Step both engines in turn; after each step every sequence's K/V must be kvlab's, and
    at the end the tokens of every request ("0" to ``num_requests - 1`` in both). The
    failed verdict, or None when all agree."""
    finished: dict[str, dict] = {"yours": {}, "kvlab": {}}
    step = 0
    while kvlab.has_unfinished_requests():
        step += 1
        step_engine(yours, finished["yours"])
        step_engine(kvlab, finished["kvlab"])
        for seq_id in kvlab.kv.seq_ids():
            mine, theirs = _context_kv(yours.cache, seq_id), _context_kv(kvlab.cache, seq_id)
            if mine.shape != theirs.shape or not torch.allclose(mine, theirs):
                detail = f"after step {step}, the K/V that seq {seq_id}'s block table points at"
                why = (
                    "two sequences wrote into the same slots: a shared block was written in "
                    "place, or a block was handed out while someone still held it"
                )
                return Verdict("generation", False, f"{detail} differ from kvlab's", why)
    yours_out = [finished["yours"].get(str(i)) for i in range(num_requests)]
    kvlab_out = [finished["kvlab"][str(i)] for i in range(num_requests)]
    why = "the engine scheduled differently: compare free_blocks with kvlab's"
    return different_requests(yours_out, kvlab_out, why)


def step_engine(engine, finished: dict[str, list]) -> None:
    """One step of ``engine``; each request it finished goes into ``finished``, with the
    tokens of each of its samples."""
    for out in engine.step():
        if out.finished:
            finished[out.request_id] = [c.token_ids for c in out.outputs]


def _context_kv(cache, seq_id: int) -> torch.Tensor:
    """Layer 0's keys and values of ``seq_id``'s tokens, read through its block table."""
    num_tokens = cache.manager.num_tokens(seq_id)
    blocks = torch.tensor(cache.manager.block_table(seq_id), dtype=torch.long)
    kv = cache.kv_caches[0][:, blocks].flatten(1, 2)  # (2, held slots, H_kv, D)
    return kv[:, :num_tokens]


class LearnerBlockManager(KVCacheManager):
    """The engine's ``KVCacheManager`` interface over a learner's block manager: every block
    comes from the learner's ``allocate_slots`` and ``fork`` and goes back through their
    ``free``; questions are answered from the learner's state, unchecked, so a wrong block
    corrupts K/V as it would in a real engine. ``plan_admission`` finds nothing cached."""

    def __init__(self, manager_class, num_blocks: int, block_size: int) -> None:
        self.learner = manager_class(num_blocks, block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size

    @property
    def num_free_blocks(self) -> int:
        return len(self.learner.free_blocks)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.learner.block_tables

    def num_tokens(self, seq_id: int) -> int:
        return self.learner.num_tokens[seq_id]

    def seq_ids(self) -> list[int]:
        return list(self.learner.block_tables)

    def held_slots(self, seq_id: int) -> int:
        return len(self.learner.block_tables[seq_id]) * self.block_size

    def block_table(self, seq_id: int) -> list[int]:
        return list(self.learner.block_tables[seq_id])

    def usage(self) -> KVUsage:
        # A walk over the held blocks (kvlab's BlockManager keeps counters instead).
        tables, size = self.learner.block_tables, self.block_size
        filled: Counter = Counter()
        for seq_id, table in tables.items():
            for index, block in enumerate(table):
                in_block = min(size, self.learner.num_tokens[seq_id] - index * size)
                filled[block] = max(filled[block], in_block)
        return KVUsage(self.num_blocks * size, len(filled) * size, sum(filled.values()))

    def block_tables(self, seq_ids: Sequence[int], seq_lens) -> np.ndarray:
        held = np.array([self.learner.num_tokens[s] for s in seq_ids])
        if (np.asarray(seq_lens) > held).any():
            raise not_held_error(seq_ids, seq_lens, held)
        width = max(1, int(-(-np.max(seq_lens, initial=0) // self.block_size)))
        rows = np.zeros((len(seq_ids), width), dtype=np.int32)
        for row, (seq_id, seq_len) in enumerate(zip(seq_ids, seq_lens, strict=True)):
            blocks = self.learner.block_tables[seq_id][: -(-int(seq_len) // self.block_size)]
            rows[row, : len(blocks)] = blocks
        return rows

    def plan_admission(self, token_ids, token_budget, max_tokens):
        num_new = int(min(len(token_ids), token_budget))
        return 0, num_new, self.blocks_for(num_new)

    def add_sequence(self, seq_id: int, token_ids=(), max_tokens=None) -> int:
        return 0  # the learner's allocate_slots starts an unknown seq_id

    def allocate_slots(self, seq_id: int, num_new_tokens: int, token_ids=None):
        return [tuple(pair) for pair in self.learner.allocate_slots(seq_id, num_new_tokens)]

    def fork(self, parent_seq_id: int, child_seq_id: int):
        self.learner.fork(parent_seq_id, child_seq_id)
        return []

    def free(self, seq_id: int) -> None:
        if seq_id in self.learner.block_tables:  # a refused admission never started it
            self.learner.free(seq_id)
