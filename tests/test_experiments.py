"""The allocator labs' measurements: serving with refusals, fragmentation, concurrency, block sizes.

Token-level correctness of ``serve`` against transformers is in ``test_cache_equivalence``;
here the oracles are hand counts on small pools.
"""

from __future__ import annotations

import pytest
from conftest import random_prompts

from kvlab.cache import ContiguousKVCache, NaiveKVCache, PagedKVCache
from kvlab.labs import Recording, describe_fullest
from kvlab.measure.experiments import (
    Fragmentation,
    block_size_tradeoff,
    fragmentation,
    max_concurrency,
)
from kvlab.measure.serve import serve
from kvlab.model.runner import ModelRunner

SHAPE = (2, 2, 4)  # num_layers, num_kv_heads, head_dim of the bookkeeping-only caches


def contiguous(num_slots: int, policy: str = "exact", max_model_len: int | None = None):
    return ContiguousKVCache(*SHAPE, num_slots, policy, max_model_len, device="cpu")


def paged(num_blocks: int, block_size: int = 4, prefix_caching: bool = False):
    return PagedKVCache(
        *SHAPE, num_blocks, block_size, device="cpu", enable_prefix_caching=prefix_caching
    )


# ---- fragmentation --------------------------------------------------------------------------


def test_contiguous_fragmentation_counts_every_slot():
    cache = contiguous(100)
    for seq_id, (prompt_len, max_tokens) in enumerate([(10, 20), (5, 15), (10, 10), (8, 2)]):
        cache.add_request(seq_id, range(prompt_len), max_tokens)
        cache.allocate_slots(seq_id, prompt_len)
    cache.free(0)  # a 30-slot hole at the front; ranges 30..49, 50..69, 70..79; tail 80..99
    frag = fragmentation(cache, request_size=25)
    assert (frag.capacity, frag.used, frag.internal) == (100, 23, 27)
    assert frag.reserved == 50
    assert frag.external == 20  # the 20-slot tail is too short for 25 slots; the hole is not
    assert frag.free == 30
    assert fragmentation(cache).external == 20  # no size: all free slots but the largest hole
    assert frag.bytes_per_slot == cache.bytes_per_slot
    assert "100 slots: used 23 (23.0%), internal 27 (27.0%)" in str(frag)


def test_paged_fragmentation_is_the_empty_tails_only():
    cache = paged(10, block_size=4)
    cache.allocate_slots(0, 5)  # 2 blocks, 3 empty slots
    cache.allocate_slots(1, 8)  # 2 full blocks
    cache.fork(1, 2)  # shares both: counted once
    frag = fragmentation(cache, request_size=1000)
    assert (frag.used, frag.internal, frag.external, frag.free) == (13, 3, 0, 24)
    assert frag.wasted == 3


def test_describe_fullest_names_the_step_with_the_most_tokens():
    history = [
        Fragmentation(capacity=100, used=used, internal=10, external=0, bytes_per_slot=8)
        for used in (5, 40, 20)
    ]
    text, peak = describe_fullest(history, "demo")
    assert peak is history[1]
    assert text.startswith("demo, at its fullest (step 1):")
    assert "reserved 50 slots (400 B), of which 80.0% hold tokens" in text
    assert "mean over 3 steps: 60.0%" in text  # (5/15 + 40/50 + 20/30) / 3
    emptied = history + [Fragmentation(100, 0, 0, 0, 8)]  # a last step that freed everything
    assert "mean over 3 steps: 60.0%" in describe_fullest(emptied, "demo")[0]


def test_fragmentation_shares_add_up():
    frag = Fragmentation(capacity=200, used=50, internal=30, external=20, bytes_per_slot=8)
    parts = (frag.used, frag.internal, frag.external, frag.free)
    assert sum(frag.share(p) for p in parts) == pytest.approx(1.0)


# ---- max concurrency ------------------------------------------------------------------------


def test_max_model_len_concurrency_is_capacity_over_max_model_len():
    result = max_concurrency(lambda: contiguous(1000, "max_model_len", 128), [20, 7], [5, 30])
    assert result.num_seqs == 1000 // 128
    assert result.reason.startswith("request 7 could not start with the others: ")
    assert "needs 128 contiguous slots" in result.reason


def test_exact_concurrency_counts_whole_reservations():
    # prompt + output: 30 and 20 slots, alternating: 30+20+30 = 80 fit in 90, 100 do not.
    result = max_concurrency(lambda: contiguous(90, "exact"), [10, 5], [20, 15])
    assert result.num_seqs == 3
    # Declared max_tokens size the reservation, whatever the real output.
    declared = max_concurrency(lambda: contiguous(90, "exact"), [10], [5], max_tokens=[35])
    assert declared.num_seqs == 2


def test_paged_concurrency_counts_blocks_at_the_peak():
    # 10 prompt + 7 output tokens: the cache ends with 16 tokens = 4 blocks of 4.
    assert max_concurrency(lambda: paged(20), [10], [7]).num_seqs == 5
    # Short requests finish early and give their blocks to the long ones.
    # Short and long alternate: 6 short + 5 long hold 11 blocks at step 0, and the 5 long
    # ones 20 at the end; a 6th long one would need 24.
    staggered = max_concurrency(lambda: paged(20), [4, 4], [1, 13])
    assert staggered.num_seqs == 11
    assert "the pool ran out" in staggered.reason and "preempted" in staggered.reason


def test_paged_concurrency_ignores_the_prefix_cache():
    """Copies of a workload are different requests: they never share prefix blocks."""
    plain = max_concurrency(lambda: paged(20), [12], [3])
    cached = max_concurrency(lambda: paged(20, prefix_caching=True), [12], [3])
    assert plain == cached


def test_a_large_enough_pool_stops_at_the_limit():
    result = max_concurrency(lambda: paged(1000), [3], [3], limit=50)
    assert result.num_seqs == 50 and result.reason == ""


def test_a_paged_request_that_cannot_start_says_how_many_blocks_it_needs():
    # 11-token prompts take 3 blocks of 4 (and 2 output tokens fill the third): six of them
    # hold 18 of 20 blocks, and a seventh waits.
    result = max_concurrency(lambda: paged(20), [11], [2])
    assert result.num_seqs == 6
    assert result.reason == (
        "request 6 could not start with the others: its 11 prompt tokens need 3 blocks; 2 are free"
    )
    # Requests that end in their first step free their blocks before the reason is asked.
    ending = max_concurrency(lambda: paged(20), [11], [1])
    assert ending.reason == "request 6 could not start with the others"


def test_max_concurrency_checks_its_workload():
    with pytest.raises(ValueError, match="same"):
        max_concurrency(lambda: paged(4), [1, 2], [1])
    with pytest.raises(ValueError, match="at least one"):
        max_concurrency(lambda: paged(4), [0], [1])
    with pytest.raises(ValueError, match="at least each request's output length"):
        max_concurrency(lambda: paged(4), [2], [5], max_tokens=[4])


# ---- block-size trade-off -------------------------------------------------------------------


def test_block_size_tradeoff_counts_tails_and_table_entries():
    costs = {c.block_size: c for c in block_size_tradeoff([5, 16, 17], block_sizes=(1, 4, 16))}
    assert costs[1].waste == 0 and costs[1].table_entries == 38
    assert (costs[4].table_entries, costs[4].num_slots) == (2 + 4 + 5, 44)
    assert (costs[16].table_entries, costs[16].num_slots) == (1 + 1 + 2, 64)
    assert costs[16].waste == pytest.approx(1 - 38 / 64)


# ---- serve ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner(tiny):
    return ModelRunner(tiny)


def test_serve_a_request_that_does_not_fit_waits_for_room(runner):
    cache = ContiguousKVCache(2, 2, 16, 60, "exact", device="cpu")
    prompts = random_prompts(256, [10, 30, 12])
    # Reservations of 18 and 38 slots leave 4; request 2 needs 20 when it arrives at step 2,
    # and starts when the first two have finished (8 tokens each: steps 0-7).
    result = serve(runner, cache, prompts, 8, arrival_steps=[0, 0, 2])
    assert result.start_steps == [0, 0, 8] and result.arrival_steps == [0, 0, 2]
    assert [len(out) for out in result.outputs] == [8, 8, 8] and not result.refused
    alone = serve(runner, ContiguousKVCache(2, 2, 16, 60, "exact", device="cpu"), prompts[2:], 8)
    assert result.outputs[2] == alone.outputs[0]
    assert result.num_steps == 16


def test_serve_refuses_a_request_that_could_never_fit_and_serves_the_others(runner):
    cache = ContiguousKVCache(2, 2, 16, 60, "exact", device="cpu")
    result = serve(runner, cache, random_prompts(256, [10, 70, 12]), 4)
    assert result.refused == {1: "prompt_len + max_tokens = 74 exceeds max_model_len=60"}
    assert result.outputs[1] is None and result.start_steps[1] is None
    assert [len(result.outputs[i]) for i in (0, 2)] == [4, 4]


def test_serve_calls_on_step_once_the_finished_requests_freed_their_memory(runner):
    cache = PagedKVCache(2, 2, 16, 16, 4, device="cpu")
    seen = []
    serve(
        runner,
        cache,
        random_prompts(256, [6]),
        3,
        on_step=lambda s, c: seen.append((s, c.num_tokens(0) if 0 in c else None)),
    )
    assert seen == [(0, 6), (1, 7), (2, None)]
    assert cache.num_free_blocks == 16


def test_serve_waits_for_a_late_arrival(runner):
    cache = PagedKVCache(2, 2, 16, 16, 4, device="cpu")
    result = serve(runner, cache, random_prompts(256, [5, 5]), 2, arrival_steps=[0, 7])
    assert result.num_steps == 4 and result.start_steps == [0, 7] and not result.refused


def test_serve_adopts_cached_prefix_blocks(runner):
    cache = PagedKVCache(2, 2, 16, 32, 4, device="cpu", enable_prefix_caching=True)
    prompt = random_prompts(256, [11])[0]
    result = serve(runner, cache, [prompt, prompt + [7]], 4, arrival_steps=[0, 10])
    assert result.num_cached_tokens == [0, 8]  # two full blocks of 4; the rest is computed
    assert len(result.outputs[1]) == 4
    # A later serve on the same cache finds them too.
    again = serve(runner, cache, [prompt], 4)
    assert again.num_cached_tokens == [8] and again.outputs[0] == result.outputs[0]


def test_serve_preempts_when_the_pool_runs_out_and_the_tokens_stay_the_same(runner):
    # Each request ends with 5 + 6 - 1 = 10 slots = 3 blocks of 4; together they need 6 of 4.
    prompts = random_prompts(256, [5, 5])
    result = serve(runner, PagedKVCache(2, 2, 16, 4, 4, device="cpu"), prompts, 6)
    assert result.num_preemptions >= 1
    for i, prompt in enumerate(prompts):
        alone = serve(runner, PagedKVCache(2, 2, 16, 4, 4, device="cpu"), [prompt], 6)
        assert result.outputs[i] == alone.outputs[0]


def test_serve_checks_its_arguments(runner):
    cache = PagedKVCache(2, 2, 16, 16, 4, device="cpu")
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        serve(runner, cache, [[1]], 0)
    with pytest.raises(ValueError, match="non-empty"):
        serve(runner, cache, [[]], 2)
    with pytest.raises(ValueError, match="one per prompt"):
        serve(runner, cache, [[1]], 2, arrival_steps=[0, 1])
    with pytest.raises(TypeError, match="pooled cache"):
        serve(runner, NaiveKVCache(2, 2, 16), [[1]], 2)
    assert serve(runner, cache, [[1]], 2).outputs[0] is not None  # the cache is still usable


def test_a_recording_keeps_each_sequences_last_block_table(runner):
    cache = paged_tiny(20)
    recording = Recording(tables=True)
    serve(runner, cache, random_prompts(256, [10, 5]), 4, on_step=recording)
    # Steps 0-2 hold both sequences; step 3 finishes them and frees every block.
    assert recording.tables[-1] == {}
    step, table = recording.last_table(0)
    # 12 tokens at step 2 (10 + the 2 fed since): 3 blocks of 4. Step 3 fed a 13th into a
    # fourth block, and freed it with the rest.
    assert step == 2 and table == recording.tables[2][0] and len(table) == 3
    with pytest.raises(ValueError, match="seq_id=7"):
        recording.last_table(7)


@pytest.mark.parametrize("make_cache", [lambda: contiguous_tiny(80), lambda: paged_tiny(20)])
def test_in_hindsight_the_held_slots_split_into_reservation_and_internal(runner, make_cache):
    cache = make_cache()
    recording = Recording()
    prompts = random_prompts(256, [10, 5])
    result = serve(runner, cache, prompts, 6, on_step=recording)  # no EOS: 6 tokens each
    assert result.final_slots == {0: 10 + 5, 1: 5 + 5}  # the last token is never fed back
    split = recording.in_hindsight(result.final_slots)
    for live, later, held in zip(recording.fragmentation, split, recording.held, strict=True):
        assert later.used == live.used and later.reserved == live.reserved
        assert later.reservation == sum(
            min(slots, result.final_slots[s]) - used for s, (slots, used) in held.items()
        )
        assert later.reservation >= 0 and later.internal >= 0
    if isinstance(cache, ContiguousKVCache):
        # exact reservations hold prompt + max_tokens slots: one more than ever written
        assert all(f.internal == len(held) for f, held in zip(split, recording.held, strict=True))
    assert split[0].reservation > 0 and split[-1].reservation == 0  # all written at the end


def contiguous_tiny(num_slots: int):
    return ContiguousKVCache(2, 2, 16, num_slots, "exact", device="cpu")


def paged_tiny(num_blocks: int):
    return PagedKVCache(2, 2, 16, num_blocks, 4, device="cpu", enable_prefix_caching=False)
