"""The engine against its oracles: every policy and cache gives the tokens of the naive
greedy loop and of transformers' ``generate``; preempted requests (recompute or swap)
finish exactly as if memory had been plentiful; bad input is refused with a reason and
the engine stays usable; metrics come from an injectable clock.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools

import pytest
import torch
from conftest import random_prompts
from test_runner import hf_greedy_batch

from kvlab import LLM, SamplingParams
from kvlab.attention import reference_attention, sdpa_attention
from kvlab.cache.base import ForwardBatch
from kvlab.cache.block_pool import AllToTheBack, BlockPool
from kvlab.cache.contiguous import ContiguousKVCache
from kvlab.cache.naive import NaiveKVCache
from kvlab.cache.paged import PagedKVCache
from kvlab.engine.metrics import ManualClock, percentile
from kvlab.model.greedy import greedy_generate
from kvlab.model.runner import ModelRunner

NEW_TOKENS = 24
LENGTHS = [1, 7, 30, 45, 3, 17]
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)


pytestmark = pytest.mark.usefixtures("one_thread")


_references: dict[str, list[list[int]]] = {}


def reference(model) -> list[list[int]]:
    """Greedy tokens of the naive loop, checked once against transformers' generate."""
    key = model.config.model_type
    if key not in _references:
        prompts = random_prompts(model.config.vocab_size, LENGTHS)
        runner = ModelRunner(model)
        cache = NaiveKVCache(model.config.num_hidden_layers, runner.num_kv_heads, runner.head_dim)
        ours = greedy_generate(runner, cache, prompts, NEW_TOKENS)
        assert ours == hf_greedy_batch(model, prompts, NEW_TOKENS)
        _references[key] = ours
    return _references[key]


def tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


# ---- equivalence ---------------------------------------------------------------------------


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
@pytest.mark.parametrize("scheduling", ["static", "dynamic", "continuous"])
def test_every_policy_and_cache_matches_greedy_generate(tiny, scheduling, kv_cache):
    prompts = random_prompts(tiny.config.vocab_size, LENGTHS)
    llm = LLM(
        tiny,
        kv_cache=kv_cache,
        scheduling=scheduling,
        max_num_seqs=4,  # two static batches; continuous requests join mid-way
        max_num_batched_tokens=16,  # chunked prefill for the long prompts
        block_size=4,
        num_blocks=256,
        max_model_len=128,
        clock=ManualClock(),
    )
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert tokens(outputs) == reference(tiny)
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)


def test_triton_backend_matches_torch(tiny):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    prompts = random_prompts(tiny.config.vocab_size, [5, 11])
    params = SamplingParams(temperature=0, max_tokens=6)
    results = []
    for backend in ("sdpa", "triton"):
        llm = LLM(tiny, attention_backend=backend, num_blocks=32, block_size=4)
        results.append(tokens(llm.generate(prompts, params, use_tqdm=False)))
    assert results[0] == results[1]


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_sdpa_attention_equals_the_reference(tiny, kv_cache):
    """A mixed step (two decodes, one prefill chunk) through both torch backends."""
    runner = ModelRunner(tiny)
    shape = (tiny.config.num_hidden_layers, runner.num_kv_heads, runner.head_dim)
    if kv_cache == "paged":
        cache = PagedKVCache(*shape, num_blocks=32, block_size=4, device="cpu")
    else:
        cache = ContiguousKVCache(*shape, num_slots=128, max_model_len=40, device="cpu")
    lens = [9, 14, 5]
    for seq_id, n in enumerate(lens):
        if kv_cache == "contiguous":
            cache.add_request(seq_id, [1] * n)
        cache.allocate_slots(seq_id, n)
        keys = torch.randn(n, *shape[1:])
        meta = cache.begin_step(ForwardBatch.build([seq_id], [0], [n]))
        for layer in range(shape[0]):
            cache.write(layer, meta, keys, keys * 0.5)
    for seq_id in range(3):
        cache.allocate_slots(seq_id, 1 if seq_id < 2 else 3)
    batch = ForwardBatch.build([0, 1, 2], lens, [1, 1, 3])
    query = torch.randn(5, runner.num_heads, runner.head_dim)
    meta = cache.begin_step(batch)
    for layer in range(shape[0]):
        cache.write(layer, meta, torch.randn(5, *shape[1:]), torch.randn(5, *shape[1:]))
        ours = sdpa_attention(query, layer, meta, cache, runner.scale)
        theirs = reference_attention(query, layer, meta, cache, runner.scale)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "num_computed, num_new", [([3, 0, 5], [1, 4, 2]), ([7, 8], [1, 1]), ([0], [5])]
)
def test_forward_batch_positions_count_on_from_each_context(num_computed, num_new):
    batch = ForwardBatch.build(list(range(len(num_new))), num_computed, num_new)
    pairs = list(zip(num_computed, num_new, strict=True))
    assert batch.positions.tolist() == [p for done, new in pairs for p in range(done, done + new)]
    assert batch.seq_lens.tolist() == [done + new for done, new in pairs]
    assert batch.query_start_loc.tolist() == [0, *itertools.accumulate(num_new)]


def test_smollm2_chat_prompts_match_generate(smollm2):
    model, tokenizer = smollm2
    questions = ["What is the capital of France?", "Name a color."]
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in questions
    ]
    llm = LLM(model, tokenizer=tokenizer, max_num_seqs=2, num_blocks=64, block_size=16)
    outputs = llm.generate(texts, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    prompts = [o.prompt_token_ids for o in outputs]
    expected = hf_greedy_batch(model, prompts, 12, eos_token_id=tokenizer.eos_token_id)
    assert tokens(outputs) == expected
    assert "Paris" in outputs[0].outputs[0].text
    assert outputs[0].prompt == texts[0]


# ---- preemption ------------------------------------------------------------------------------

PRESSURE = [12, 5, 20, 9, 3, 16, 7, 11]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("scheduling", ["continuous", "static"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_preempted_requests_finish_with_the_same_tokens(tiny, mode, scheduling, sampled):
    prompts = random_prompts(tiny.config.vocab_size, PRESSURE, seed=3)
    if sampled:
        params = [
            SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20, seed=i)
            for i in range(len(prompts))
        ]
    else:
        params = SamplingParams(temperature=0, max_tokens=20)
    plenty = LLM(tiny, num_blocks=256, block_size=4, max_num_seqs=8)
    expected = tokens(plenty.generate(prompts, params, use_tqdm=False))
    assert plenty.metrics.num_preemptions == 0
    # 16 blocks of 4 tokens: the 8 requests need up to 40 tokens (10 blocks) each.
    tight = LLM(
        tiny,
        num_blocks=16,
        block_size=4,
        max_num_seqs=8,
        scheduling=scheduling,
        preemption_mode=mode,
        swap_space_bytes=1 << 20,
    )
    assert tokens(tight.generate(prompts, params, use_tqdm=False)) == expected
    metrics = tight.metrics
    assert metrics.num_preemptions > 0
    if mode == "swap":
        assert metrics.num_swap_outs > 0 and metrics.num_swap_ins == metrics.num_swap_outs
    assert tight.engine.cache.num_free_blocks == 16  # everything came back


@pytest.mark.parametrize("seed", range(12))
def test_swapping_with_shared_prefixes_keeps_every_token(tiny, seed):
    """Eight requests whose prompts share prefixes, swapped in and out of an 8-block pool
    (prefix caching on): the same tokens as with room for all. Blocks that come back and
    leave again within a step are hashed, so they must be filled before they are freed."""
    import random

    rng = random.Random(seed)
    prefixes = ([1, 2, 3, 4, 5, 6, 7, 8, 9], [50, 51, 52, 53, 54])
    prompts = [
        rng.choice(prefixes)[: rng.randint(2, 9)] + [100 + i] * rng.randint(0, 6) for i in range(8)
    ]
    params = [
        SamplingParams(temperature=0, max_tokens=rng.randint(1, 12), ignore_eos=True)
        for _ in prompts
    ]
    runs = []
    for pool in ({"num_blocks": 64}, {"num_blocks": 8, "preemption_mode": "swap"}):
        llm = LLM(tiny, block_size=4, max_num_seqs=4, max_num_batched_tokens=16, **pool)
        runs.append(tokens(llm.generate(prompts, params, use_tqdm=False)))
    assert runs[1] == runs[0]


def test_prefetch_brings_swapped_blocks_back_a_step_early(tiny):
    prompts = random_prompts(tiny.config.vocab_size, [5, 9, 14, 3, 20, 11, 6, 8])
    params = SamplingParams(temperature=0, max_tokens=24)
    expected = tokens(
        LLM(tiny, num_blocks=256, block_size=4).generate(prompts, params, use_tqdm=False)
    )
    runs = {}
    for prefetch in (True, False):
        llm = LLM(
            tiny,
            num_blocks=12,
            block_size=4,
            max_num_seqs=4,
            preemption_mode="swap",
            prefetch=prefetch,
        )
        copied = count_swap_copies(llm)
        seen = []
        assert tokens(llm.generate(prompts, params, use_tqdm=False, on_step=seen.append)) == (
            expected
        )
        assert any(s.swapped_in for s in seen) and any(s.swapped_out for s in seen)
        # Every block copied is counted once: in the step that waited for it, or as
        # prefetched in the step whose compute hid it (not again when its request resumes).
        assert sum(s.num_blocks_swapped for s in seen) == copied["waited"]
        assert sum(s.num_blocks_prefetched for s in seen) == copied["prefetched"]
        runs[prefetch] = llm.metrics
    assert runs[True].num_prefetched > 0
    assert runs[False].num_prefetched == 0
    with pytest.raises(ValueError, match="prefetch='yes' is not allowed"):
        LLM(tiny, num_blocks=12, block_size=4, preemption_mode="swap", prefetch="yes")


def count_swap_copies(llm) -> dict[str, int]:
    """Count the blocks ``llm``'s swap space really copies, split by who asked for them."""
    swap, engine = llm.engine.swap_space, llm.engine
    copied = {"waited": 0, "prefetched": 0}
    swap_out, swap_in, move_blocks = swap.swap_out, swap.swap_in, engine._move_blocks
    planned = []

    def counting_swap_out(moves):
        copied["waited"] += len(moves)
        swap_out(moves)

    def counting_swap_in(moves):
        # The engine copies back twice a step: the blocks it waits for, then the prefetch.
        out = planned[-1]
        assert moves in (out.blocks_to_swap_in, out.blocks_to_prefetch)
        copied["prefetched" if moves is out.blocks_to_prefetch else "waited"] += len(moves)
        swap_in(moves)

    def recording_move_blocks(out):
        planned.append(out)
        move_blocks(out)

    swap.swap_out, swap.swap_in, engine._move_blocks = (
        counting_swap_out,
        counting_swap_in,
        recording_move_blocks,
    )
    return copied


# ---- clock, arrivals, metrics ------------------------------------------------------------------


def test_manual_clock_gives_exact_latencies(tiny):
    llm = LLM(tiny, num_blocks=32, block_size=4, clock=ManualClock(step_seconds=1.0))
    prompts = random_prompts(tiny.config.vocab_size, [5, 5])
    params = SamplingParams(temperature=0, max_tokens=4)
    outputs = llm.generate(prompts, params, use_tqdm=False, arrival_times=[0.0, 10.0])
    first, late = (o.metrics for o in outputs)
    assert (first.ttft, first.tpot, first.e2e, first.queue_time) == (1.0, 1.0, 4.0, 0.0)
    # the engine idles until the second request arrives, then serves it the same way
    assert (late.arrival_time, late.ttft, late.e2e) == (10.0, 1.0, 4.0)
    summary = llm.metrics.summary()
    assert summary["num_steps"] == 8 and summary["ttft_p50"] == 1.0
    assert summary["output_tokens_per_s"] == 8 / 14  # from the first step's start to the end
    assert len(llm.metrics.kv_usage()) == len(llm.metrics.queue_depth()) == 8


def test_step_callback_sees_every_step_and_queue(tiny):
    llm = LLM(tiny, num_blocks=64, block_size=4, max_num_seqs=2, clock=ManualClock())
    prompts = random_prompts(tiny.config.vocab_size, [4, 6, 8])
    seen = []
    llm.generate(
        prompts, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False, on_step=seen.append
    )
    assert [s.step for s in seen] == list(range(len(seen)))
    assert seen[0].num_waiting == 1 and seen[0].num_running == 2
    assert seen[0].num_prefill_tokens == 10 and seen[1].num_decode_tokens == 2
    assert seen[-1].num_running == 0 and 0 < max(s.kv_usage for s in seen) <= 1


def test_engine_step_by_step(tiny):
    llm = LLM(tiny, num_blocks=64, block_size=4)
    engine = llm.engine
    engine.add_request("a", [5, 6, 7], SamplingParams(temperature=0, max_tokens=2))
    first = engine.step()
    assert [o.request_id for o in first] == ["a"] and not first[0].finished
    second = engine.step()
    assert second[0].finished and len(second[0].outputs[0].token_ids) == 2
    assert not engine.has_unfinished_requests()


def test_abort_releases_memory(tiny):
    llm = LLM(tiny, num_blocks=32, block_size=4)
    engine = llm.engine
    engine.add_request("x", list(range(3, 20)), SamplingParams(temperature=0, max_tokens=50))
    engine.step()
    assert engine.cache.num_free_blocks < 32
    engine.abort_request("x")
    assert engine.cache.num_free_blocks == 32 and not engine.has_unfinished_requests()


def test_percentile():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert percentile([], 50) != percentile([], 50)  # nan


# ---- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"block_size": 0}, "block_size=0"),
        ({"num_blocks": -1}, "num_blocks=-1"),
        ({"max_num_seqs": 0}, "max_num_seqs=0"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens=0"),
        ({"kv_cache": "ring"}, "kv_cache='ring'"),
        ({"scheduling": "eager"}, "scheduling='eager'"),
        ({"batch_timeout": -1}, "batch_timeout=-1"),
        ({"watermark": 1.5}, "watermark=1.5"),
        ({"attention_backend": "flash"}, "attention_backend='flash'"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization=0"),
        ({"kv_cache_memory_bytes": 10}, "kv_cache_memory_bytes=10"),
        ({"max_model_len": 100000}, "max_model_len=100000"),
        ({"swap_space_bytes": 0}, "swap_space_bytes=0"),
        ({"kv_cache": "contiguous", "preemption_mode": "swap"}, "preemption_mode='swap'"),
        ({"kv_cache": "contiguous", "attention_backend": "triton"}, "attention_backend='triton'"),
        ({"preemption_mode": "swap", "swap_space_bytes": 5}, "swap_space_bytes=5"),
        ({"block_pool": "lru"}, "block_pool='lru'"),
        ({"kv_cache": "contiguous", "block_pool": BlockPool}, "block_pool is not allowed"),
    ],
)
def test_bad_engine_settings_are_refused_with_a_reason(tiny, kwargs, message):
    kwargs.setdefault("num_blocks", None if "kv_cache_memory_bytes" in kwargs else 16)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        LLM(tiny, **kwargs)


def test_a_block_pool_of_ones_own_serves_the_engine(tiny):
    """``LLM(block_pool=...)`` builds the pool with ``num_blocks``; the manager takes every
    block from it. Another eviction order in a tight pool (every freed block to the back)
    evicts other blocks, and the tokens stay the same."""
    built = []

    def one_queue(num_blocks):
        built.append(BlockPool(num_blocks, eviction_policy=AllToTheBack))
        return built[-1]

    system = random_prompts(tiny.config.vocab_size, [12])[0]
    prompts = [system + tail for tail in random_prompts(tiny.config.vocab_size, [3, 5, 4, 6])]
    params = SamplingParams(temperature=0, max_tokens=6)
    runs = {}
    for name, pool in (("kvlab", None), ("one queue", one_queue)):
        llm = LLM(tiny, num_blocks=12, block_size=4, max_num_seqs=2, block_pool=pool)
        runs[name] = tokens(llm.generate(prompts, params, use_tqdm=False))
        assert llm.metrics.num_prompt_tokens_hit > 0
    assert len(built) == 1 and built[0].num_blocks == 12
    assert built[0].num_held_blocks == 0 and built[0].num_free_blocks == 12  # all came back
    assert runs["one queue"] == runs["kvlab"]


def test_bad_requests_are_refused_and_the_engine_stays_usable(tiny):
    llm = LLM(tiny, num_blocks=8, block_size=4, max_model_len=64)  # 32 KV slots
    ok = SamplingParams(temperature=0, max_tokens=4)
    cases = [
        ([[]], ok, "prompt is empty"),
        (["some text"], ok, "needs a tokenizer"),
        ([[3, 999]], ok, "token id 999"),
        ([list(range(3, 80))], ok, "max_model_len"),
        ([[5] * 20], SamplingParams(max_tokens=30), "needs 13 KV blocks"),
        ([[5, 6], [7, 8]], [ok], "one value per prompt"),
        ([[5, 6]], "greedy", "sampling_params='greedy'"),
        ([], ok, "prompts=\\[\\]"),
    ]
    for prompts, params, message in cases:
        with pytest.raises(ValueError, match=message):
            llm.generate(prompts, params, use_tqdm=False)
    # A refused prompt refuses its whole call, before anything ran; the engine is intact.
    with pytest.raises(ValueError, match="prompt 1:"):
        llm.generate([[5, 6], []], ok, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.cache.num_free_blocks == 8
    out = llm.generate([[5, 6, 7]], ok, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_duplicate_request_ids_are_refused(tiny):
    engine = LLM(tiny, num_blocks=8, block_size=4).engine
    engine.add_request("same", [4, 5], SamplingParams(temperature=0, max_tokens=2))
    with pytest.raises(ValueError, match="request_id='same'"):
        engine.add_request("same", [4, 5])


def test_kv_pool_sized_from_a_memory_budget(tiny):
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 20, block_size=16, max_num_seqs=4)
    spec = llm.engine.runner.kv_spec()
    by_budget = (1 << 20) // (spec.bytes_per_token * 16)
    by_need = 4 * -(-tiny.config.max_position_embeddings // 16)
    assert llm.engine.cache.num_blocks == min(by_budget, by_need)
