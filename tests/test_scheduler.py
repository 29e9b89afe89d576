"""The scheduler without a model: who runs when under each policy, budgets, watermark,
preemption and swapping. A fake step stands in for the forward pass: every computed
sequence whose tokens are all computed "samples" token 7.
"""

from __future__ import annotations

import pytest

from kvlab.cache.contiguous import ContiguousKVCache
from kvlab.cache.paged import PagedKVCache
from kvlab.engine.request import Request, RequestStatus
from kvlab.engine.sampling_params import SamplingParams
from kvlab.engine.scheduler import Scheduler, WaitingQueue
from kvlab.engine.scheduler_config import SchedulerConfig


def paged(num_blocks=64, block_size=4) -> PagedKVCache:
    return PagedKVCache(1, 1, 2, num_blocks=num_blocks, block_size=block_size, device="cpu")


def request(seq_id, prompt_len=4, max_tokens=3, arrival=0.0, priority=0, first_token=10):
    prompt = list(range(first_token + seq_id * 100, first_token + seq_id * 100 + prompt_len))
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    return Request(str(seq_id), seq_id, prompt, params, arrival_time=arrival, priority=priority)


class Driver:
    """Steps a scheduler the way the engine does, with token 7 as every sampled token."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.now = 0.0
        self.log: list[list[tuple[int, int]]] = []  # per step: (seq_id, num_new_tokens)
        self.outs = []

    def step(self):
        out = self.scheduler.schedule(self.now)
        self.outs.append(out)
        scheduled = list(zip(out.requests, out.num_new_tokens, strict=True))
        self.log.append([(r.seq_id, n) for r, n in scheduled])
        finished = []
        for r, n in scheduled:
            r.num_computed_tokens += n
            if r.num_computed_tokens == r.num_tokens and r.append_token(7):
                finished.append(r)
        self.scheduler.finish_running(finished)
        self.now += 1.0
        return out

    def run(self, max_steps=100):
        while self.scheduler.has_unfinished() and len(self.log) < max_steps:
            self.step()
        assert not self.scheduler.has_unfinished()

    def steps_of(self, seq_id) -> list[int]:
        return [i for i, step in enumerate(self.log) if any(s == seq_id for s, _ in step)]


def make(scheduling="continuous", cache=None, **kwargs):
    num_cpu_blocks = kwargs.pop("num_cpu_blocks", 0)
    config = SchedulerConfig(scheduling=scheduling, **kwargs)
    return Scheduler(config, (cache or paged()).manager, num_cpu_blocks)


# ---- who runs when -------------------------------------------------------------------------


def test_static_batch_runs_to_completion_before_the_next():
    scheduler = make("static", max_num_seqs=2)
    short, long_, late1, late2 = (request(i, max_tokens=m) for i, m in enumerate([1, 4, 1, 1]))
    for r in (short, long_, late1, late2):
        scheduler.add_request(r)
    driver = Driver(scheduler)
    driver.run()
    # seq 0 finishes after step 0, but seq 2 waits until seq 1 (same batch) is done too.
    assert driver.steps_of(0) == [0]
    assert driver.steps_of(1) == [0, 1, 2, 3]
    assert driver.steps_of(2) == [4] and driver.steps_of(3) == [4]


def test_continuous_admits_as_soon_as_a_seat_frees():
    scheduler = make("continuous", max_num_seqs=2)
    for i, m in enumerate([1, 4, 1, 1]):
        scheduler.add_request(request(i, max_tokens=m))
    driver = Driver(scheduler)
    driver.run()
    assert driver.steps_of(2) == [1]  # seq 0 left after step 0
    assert driver.steps_of(3) == [2]


def test_dynamic_waits_for_a_full_batch_or_the_timeout():
    scheduler = make("dynamic", max_num_seqs=3, batch_timeout=5.0)
    scheduler.add_request(request(0, arrival=0.0))
    assert not scheduler.schedule(now=1.0)  # 1 of 3 seats filled, waited 1 s of 5
    assert scheduler.next_wakeup() == 5.0
    scheduler.add_request(request(1, arrival=2.0))
    assert not scheduler.schedule(now=4.9)
    out = scheduler.schedule(now=5.0)  # the oldest has waited batch_timeout
    assert [r.seq_id for r in out.requests] == [0, 1]
    assert scheduler.next_wakeup() is None  # a batch is running


def test_dynamic_starts_at_once_when_the_batch_is_full():
    scheduler = make("dynamic", max_num_seqs=2, batch_timeout=100.0)
    scheduler.add_request(request(0))
    scheduler.add_request(request(1))
    out = scheduler.schedule(now=0.0)
    assert [r.seq_id for r in out.requests] == [0, 1]


def test_chunked_prefill_respects_the_token_budget():
    scheduler = make("continuous", max_num_seqs=4, max_num_batched_tokens=8)
    scheduler.add_request(request(0, prompt_len=3, max_tokens=10))
    scheduler.add_request(request(1, prompt_len=21, max_tokens=2))
    driver = Driver(scheduler)
    driver.run()
    for step in driver.log:
        assert sum(n for _, n in step) <= 8
    # seq 0 (running, decoding) always gets its token first; seq 1's prompt comes in chunks
    assert driver.log[0] == [(0, 3), (1, 5)]
    assert driver.log[1] == [(0, 1), (1, 7)]
    assert driver.log[2] == [(0, 1), (1, 7)]
    assert driver.log[3] == [(0, 1), (1, 2)]  # the last chunk, then seq 1 samples


def test_static_computes_whole_prompts_without_a_budget():
    scheduler = make("static", max_num_batched_tokens=8)
    scheduler.add_request(request(0, prompt_len=21))
    out = scheduler.schedule(0.0)
    assert out.num_new_tokens == [21]


def test_priority_policy_admits_lower_priority_values_first():
    scheduler = make(max_num_seqs=1, scheduling_policy="priority")
    scheduler.add_request(request(0, priority=5))
    scheduler.add_request(request(1, priority=1, arrival=3.0))
    out = scheduler.schedule(3.0)
    assert [r.seq_id for r in out.requests] == [1]


def test_waiting_queue_orders():
    fcfs = WaitingQueue("fcfs")
    a, b, c = request(0), request(1), request(2)
    fcfs.push(a)
    fcfs.push(b)
    fcfs.push_front(c)
    assert list(fcfs) == [c, a, b]
    fcfs.remove(a)
    assert list(fcfs) == [c, b] and fcfs.oldest_arrival() == 0.0
    prio = WaitingQueue("priority")
    x, y, z = request(0, priority=2), request(1, priority=0, arrival=5.0), request(2, priority=2)
    for r in (x, y, z):
        prio.push(r)
    assert list(prio) == [y, x, z]
    prio.remove(y)
    assert list(prio) == [x, z] and len(prio) == 2


# ---- memory: watermark, prefix cache, preemption --------------------------------------------


@pytest.mark.parametrize("threshold, admitted_together", [(0.0, True), (0.5, False)])
def test_watermark_keeps_blocks_in_reserve(threshold, admitted_together):
    # 16 blocks of 4: each request's 20-token prompt takes 5 blocks, so after two only 6 of
    # 16 blocks (37.5%) stay reusable: below a 50% watermark, the second one must wait.
    scheduler = make(cache=paged(16), watermark=threshold)
    scheduler.add_request(request(0, prompt_len=20))
    scheduler.add_request(request(1, prompt_len=20))
    out = scheduler.schedule(0.0)
    assert (len(out.requests) == 2) == admitted_together


def test_watermark_never_starves_a_request_that_fits_alone():
    scheduler = make(cache=paged(16), watermark=0.9)
    scheduler.add_request(request(0, prompt_len=20))
    assert len(scheduler.schedule(0.0).requests) == 1


def test_prefix_cache_hit_skips_computed_blocks():
    scheduler = make(cache=paged(64))
    first = request(0, prompt_len=13)
    scheduler.add_request(first)
    Driver(scheduler).run()
    twin = request(1, prompt_len=13)
    twin.prompt_token_ids[:] = first.prompt_token_ids
    twin.__post_init__()  # token_ids from the new prompt
    scheduler.add_request(twin)
    out = scheduler.schedule(0.0)
    assert twin.num_cached_tokens == 12  # three full blocks of 4
    assert out.num_new_tokens == [1]
    assert scheduler.num_prompt_tokens_hit == 12


def test_recompute_preemption_takes_the_newest_and_requeues_it_first():
    # 6 blocks of 4 tokens: two requests of 8 prompt tokens fit (4 blocks); as they grow
    # past 12 tokens each needs a third, and only 2 are free, then none.
    scheduler = make(cache=paged(6), max_num_seqs=4)
    old, new = request(0, prompt_len=8, max_tokens=10), request(1, prompt_len=8, max_tokens=10)
    scheduler.add_request(old)
    scheduler.add_request(new)
    driver = Driver(scheduler)
    while not scheduler.num_preemptions:
        driver.step()
    out = driver.outs[-1]
    assert out.preempted == [new] and new.status is RequestStatus.WAITING
    assert new.num_computed_tokens == 0 and new.num_preemptions == 1
    assert list(scheduler.waiting)[0] is new
    assert out.requests == [old]
    driver.run()
    assert new.output_token_ids == [7] * 10  # it finished after all


def test_swap_preemption_copies_blocks_out_and_back():
    cache = paged(6)
    scheduler = make(cache=cache, max_num_seqs=4, preemption_mode="swap", num_cpu_blocks=8)
    old, new = request(0, prompt_len=8, max_tokens=10), request(1, prompt_len=8, max_tokens=10)
    scheduler.add_request(old)
    scheduler.add_request(new)
    driver = Driver(scheduler)
    driver.run()
    assert scheduler.num_swap_outs >= 1 and scheduler.num_swap_ins == scheduler.num_swap_outs
    assert new.output_token_ids == [7] * 10
    assert scheduler.swap.num_free_blocks == 8  # every CPU block came back
    # Only CPU blocks written by a swap out are copied back (fewer: a block still in the
    # prefix cache is adopted instead).
    parked = [c for out in driver.outs for _, c in out.blocks_to_swap_out]
    back = [c for out in driver.outs for c, _ in out.blocks_to_swap_in]
    assert back and set(back) <= set(parked) and len(back) <= len(parked)
    assert cache.num_free_blocks == 6


def test_swap_falls_back_to_recompute_when_the_cpu_pool_is_full():
    cache = paged(6)
    # A CPU pool of one block is too small for any victim.
    scheduler = make(cache=cache, preemption_mode="swap", num_cpu_blocks=1)
    for i in range(2):
        scheduler.add_request(request(i, prompt_len=8, max_tokens=10))
    Driver(scheduler).run()
    assert scheduler.num_preemptions >= 1 and scheduler.num_swap_outs == 0


def test_priority_preemption_takes_the_lowest_priority():
    scheduler = make(cache=paged(6), scheduling_policy="priority")
    important = request(0, prompt_len=8, max_tokens=10, priority=0)
    background = request(1, prompt_len=8, max_tokens=10, priority=9)
    scheduler.add_request(background)
    scheduler.add_request(important)
    driver = Driver(scheduler)
    driver.run()
    assert background.num_preemptions >= 1 and important.num_preemptions == 0


def test_a_victim_already_scheduled_gives_its_tokens_back_to_the_budget():
    """Under priority, the background request (admitted first, alone) decodes first in a
    step; then the important one needs a block, and the background one is preempted. Its
    token goes back to the step's budget, so the prefill behind them gets one more."""
    scheduler = make(
        cache=paged(5), scheduling_policy="priority", max_num_seqs=3, max_num_batched_tokens=6
    )
    background = request(0, prompt_len=3, max_tokens=12, priority=9)
    scheduler.add_request(background)
    driver = Driver(scheduler)
    driver.step()
    scheduler.add_request(request(1, prompt_len=3, max_tokens=12, priority=0, arrival=1.0))
    scheduler.add_request(request(2, prompt_len=12, max_tokens=4, priority=0, arrival=1.0))
    driver.step()
    driver.step()
    out = driver.step()
    assert out.preempted == [background] and background.num_preemptions == 1
    assert driver.log[-1] == [(1, 1), (2, 5)]  # 6 tokens: the whole budget
    driver.run()


class OneByOne(Scheduler):
    """The scheduler without its decode fast path: every request goes through the loop."""

    def _schedule_decodes(self, out):
        return 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("seed", range(4))
def test_the_decode_fast_path_schedules_exactly_as_the_loop(mode, policy, seed):
    """Tight pools, chunked prompts, forks of blocks and preemptions: the step plans, the
    blocks taken and the copies are the same with ``_schedule_decodes`` and without."""
    import random

    rng = random.Random(seed)
    work = [
        (rng.randint(1, 14), rng.randint(1, 12), rng.randint(0, 3), float(rng.randint(0, 6)))
        for _ in range(10)
    ]
    runs = []
    for scheduler_class in (Scheduler, OneByOne):
        cache = paged(num_blocks=9, block_size=4)
        config = SchedulerConfig(
            max_num_seqs=6,
            max_num_batched_tokens=12,
            preemption_mode=mode,
            scheduling_policy=policy,
        )
        scheduler = scheduler_class(config, cache.manager, 8 if mode == "swap" else 0)
        for seq_id, (prompt_len, max_tokens, priority, arrival) in enumerate(work):
            scheduler.add_request(
                request(seq_id, prompt_len, max_tokens, arrival, priority, first_token=3)
            )
        driver = Driver(scheduler)
        driver.run(max_steps=400)
        moves = [(o.blocks_to_copy, o.blocks_to_swap_out, o.blocks_to_swap_in) for o in driver.outs]
        runs.append((driver.log, moves, scheduler.num_preemptions))
    assert runs[0] == runs[1]
    assert runs[0][2] > 0  # the pool is tight enough to preempt


def first_wrong_read(seed: int, mode: str, policy: str) -> str | None:
    """Drive the scheduler over a tight pool with a fake device that keeps, for each block,
    the token each slot holds: every step makes its planned moves in the engine's order
    (out to CPU, copy-on-write, back, prefetch), checks that each scheduled request reads
    its own tokens at every computed position, then writes its new ones. Prompts share
    prefixes, so blocks are adopted from the prefix cache, freed and evicted."""
    import random

    rng = random.Random(seed)
    block_size, num_seqs = rng.choice([2, 4]), rng.randint(2, 6)
    # The longest request (15 prompt and 12 output tokens) just fits alone.
    cache = paged(num_blocks=-(-28 // block_size) + rng.randint(0, 3), block_size=block_size)
    config = SchedulerConfig(
        max_num_seqs=num_seqs,
        max_num_batched_tokens=rng.randint(num_seqs, 16),
        preemption_mode=mode,
        scheduling_policy=policy,
        prefetch=rng.random() < 0.5,
    )
    scheduler = Scheduler(config, cache.manager, rng.choice([4, 8, 16]) if mode == "swap" else 0)
    prefixes = ([1, 2, 3, 4, 5, 6, 7, 8, 9], [50, 51, 52, 53, 54])
    pending = []
    for seq_id in range(rng.randint(4, 12)):
        prompt = rng.choice(prefixes)[: rng.randint(2, 9)] + [100 + seq_id] * rng.randint(0, 6)
        params = SamplingParams(temperature=0, max_tokens=rng.randint(1, 12))
        arrival, priority = float(rng.randint(0, 5)), rng.randint(0, 3)
        pending.append(Request(str(seq_id), seq_id, prompt, params, arrival, priority=priority))
    pending.sort(key=lambda r: r.arrival_time)
    device, cpu = {}, {}
    for step in range(400):
        while pending and pending[0].arrival_time <= step:
            scheduler.add_request(pending.pop(0))
        if not (pending or scheduler.has_unfinished()):
            return None
        out = scheduler.schedule(float(step))
        scheduler.prefetch(out)
        for block, cpu_block in out.blocks_to_swap_out:
            cpu[cpu_block] = list(device.get(block, [None] * block_size))
        for src, dst in out.blocks_to_copy:
            device[dst] = list(device.get(src, [None] * block_size))
        for cpu_block, block in out.blocks_to_swap_in + out.blocks_to_prefetch:
            device[block] = list(cpu[cpu_block])
        for request, num_new in zip(out.requests, out.num_new_tokens, strict=True):
            table, ids = cache.manager.block_table(request.seq_id), request.token_ids
            for pos in range(request.num_computed_tokens + num_new):
                held = device.setdefault(table[pos // block_size], [None] * block_size)
                if pos >= request.num_computed_tokens:
                    held[pos % block_size] = ids[pos]
                elif held[pos % block_size] != ids[pos]:
                    return (
                        f"step {step}: seq {request.seq_id} reads {held[pos % block_size]} at {pos}"
                    )
        finished = []
        for request, num_new in zip(out.requests, out.num_new_tokens, strict=True):
            request.num_computed_tokens += num_new
            if request.num_computed_tokens == request.num_tokens:
                if request.append_token(200 + request.seq_id):
                    finished.append(request)
        scheduler.finish_running(finished)
    return "did not finish"


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_every_step_reads_the_kv_its_requests_wrote(mode, policy):
    """The plan's moves keep every block's contents: swap-outs, copies, swap-ins (also one
    undone in its step: its blocks are hashed, so they must be filled) and prefetches."""
    wrong = {seed: first_wrong_read(seed, mode, policy) for seed in range(150)}
    assert {seed: why for seed, why in wrong.items() if why} == {}


def test_contiguous_cache_admits_only_what_its_reservations_fit():
    cache = ContiguousKVCache(1, 1, 2, num_slots=40, reservation_policy="exact", device="cpu")
    scheduler = make(cache=cache)
    for i in range(3):
        scheduler.add_request(request(i, prompt_len=10, max_tokens=8))  # 18 slots each
    out = scheduler.schedule(0.0)
    assert [r.seq_id for r in out.requests] == [0, 1]
    driver = Driver(scheduler)
    driver.run()
    assert scheduler.waiting.scheduling_policy == "fcfs" and not scheduler.has_unfinished()


# ---- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"scheduling": "fifo"}, "scheduling='fifo'"),
        ({"max_num_seqs": 0}, "max_num_seqs=0"),
        ({"max_num_batched_tokens": -5}, "max_num_batched_tokens=-5"),
        ({"max_num_seqs": 8, "max_num_batched_tokens": 4}, "max_num_batched_tokens=4"),
        ({"batch_timeout": -1.0}, "batch_timeout=-1.0"),
        ({"batch_timeout": float("inf")}, "batch_timeout=inf"),
        ({"watermark": 1.0}, "watermark=1.0"),
        ({"watermark": -0.1}, "watermark=-0.1"),
        ({"preemption_mode": "kill"}, "preemption_mode='kill'"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy='lifo'"),
    ],
)
def test_config_errors_name_the_parameter_and_value(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        SchedulerConfig(**kwargs)


def test_swap_mode_needs_a_swap_space():
    for bad in (0, -1, True, 2.0, None):
        with pytest.raises(ValueError, match=rf"num_cpu_blocks={bad!r} is not allowed"):
            Scheduler(SchedulerConfig(preemption_mode="swap"), paged().manager, bad)
    contiguous = ContiguousKVCache(1, 1, 2, num_slots=8, device="cpu")
    with pytest.raises(ValueError, match="paged KV blocks"):
        Scheduler(SchedulerConfig(preemption_mode="swap"), contiguous.manager, 4)


def test_dynamic_batch_starts_exactly_at_its_timeout():
    """An idle engine wakes at arrival + batch_timeout; the batch must then be ready, even
    where ``now - arrival`` rounds just below the timeout in floating point."""
    from kvlab import LLM, SamplingParams
    from kvlab.engine.metrics import ManualClock

    llm = LLM("tiny", scheduling="dynamic", batch_timeout=0.8, clock=ManualClock(), seed=0)
    outputs = llm.generate(
        [[5, 6, 7]],
        SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
        arrival_times=[1.4632236633951825],
        use_tqdm=False,
    )
    assert len(outputs[0].outputs[0].token_ids) == 3


def prefetch_counts(seed: int) -> dict[str, int]:
    """Drive a swapping scheduler with prefetch over a tight pool, aborting a swapped
    request now and then; count the swap-ins that found their request already copied back
    (resident), and how often a resident copy was wasted (undone, dropped or aborted)."""
    import random

    rng = random.Random(seed)
    cache = paged(num_blocks=9 + rng.randint(0, 4), block_size=2)
    config = SchedulerConfig(max_num_seqs=rng.randint(2, 5), preemption_mode="swap", prefetch=True)
    scheduler = Scheduler(config, cache.manager, 32)
    for seq_id in range(rng.randint(4, 10)):
        scheduler.add_request(
            request(seq_id, prompt_len=rng.randint(2, 8), max_tokens=rng.randint(1, 10))
        )
    swap = scheduler.swap
    counts = {"served": 0, "wasted": 0}
    for step in range(400):
        if not scheduler.has_unfinished():
            break
        resident = {r.seq_id for r in scheduler.swapped if swap.is_resident(r.seq_id)}
        out = scheduler.schedule(float(step))
        counts["served"] += sum(r.seq_id in resident for r in out.swapped_in)
        still = {r.seq_id for r in scheduler.swapped if swap.is_resident(r.seq_id)}
        counts["wasted"] += len(resident - still - {r.seq_id for r in out.swapped_in})
        scheduler.prefetch(out)
        finished = []
        for r, n in zip(out.requests, out.num_new_tokens, strict=True):
            r.num_computed_tokens += n
            if r.num_computed_tokens == r.num_tokens and r.append_token(7):
                finished.append(r)
        scheduler.finish_running(finished)
        parked = [r for r in scheduler.swapped if swap.is_resident(r.seq_id)]
        if parked and rng.random() < 0.2:
            scheduler.finish(parked[0])  # an abort
            counts["wasted"] += 1
    assert not scheduler.has_unfinished()
    counts["num_prefetched"] = scheduler.num_prefetched
    return counts


def test_num_prefetched_counts_only_the_prefetches_a_swap_in_used():
    """A prefetched copy that is dropped, undone or aborted before its request resumes
    is not counted."""
    runs = [prefetch_counts(seed) for seed in range(60)]
    assert [r["num_prefetched"] for r in runs] == [r["served"] for r in runs]
    assert sum(r["served"] for r in runs) > 0 and sum(r["wasted"] for r in runs) > 0
