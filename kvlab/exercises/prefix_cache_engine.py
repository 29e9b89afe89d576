"""Lab 06's build-it in the real engine: a learner's block pool serves the prefix cache.

``check_generation`` serves SmolLM2 requests that share one system prompt, prefix caching
on, twice and side by side: once with a ``BlockManager`` that takes its blocks from the
learner's pool (``LearnerPool``), once with kvlab's own. The first request arrives alone;
the others arrive after its prefill, so their system prompt is found in the cache. After
every step each sequence's K/V, read through its block table, must be the same in both
engines; at the end every token, and the number of prompt tokens the cache served.

Not handled: eviction under memory pressure in the engine (the property checks cover it).
"""

from __future__ import annotations

from kvlab.cache.block_manager import BlockManager
from kvlab.exercises.block_manager_engine import run_side_by_side
from kvlab.exercises.grading import Verdict, engine_stopped, one_torch_thread
from kvlab.exercises.learner_pool import LearnerPool

SYSTEM = "You are a helpful assistant. Answer in one short sentence, and be precise."
QUESTIONS = ("What is a KV cache?", "Name a prime number.", "What is 2 + 2?")
NUM_BLOCKS, BLOCK_SIZE = 64, 8


def check_generation(pool_class, model=None, tokenizer=None) -> Verdict:
    """Serve requests with one system prompt through the learner's pool, against kvlab's."""
    from kvlab.cache.paged import PagedKVCache
    from kvlab.engine.llm_engine import LLMEngine
    from kvlab.engine.metrics import ManualClock
    from kvlab.engine.sampling_params import SamplingParams
    from kvlab.engine.scheduler_config import SchedulerConfig
    from kvlab.model.loading import chat_prompt, load_model
    from kvlab.model.runner import ModelRunner

    if model is None:
        model, tokenizer = load_model("smollm2-135m", device="cpu")
    if tokenizer is None:
        raise ValueError("check_generation needs the model's tokenizer (for the chat prompts)")
    prompts = [chat_prompt(tokenizer, q, system=SYSTEM) for q in QUESTIONS]
    runner = ModelRunner(model, attention="sdpa")
    params = SamplingParams(temperature=0, max_tokens=8)
    try:
        with one_torch_thread():
            engines = {}
            for name in ("yours", "kvlab"):
                pool = LearnerPool(pool_class(NUM_BLOCKS)) if name == "yours" else None
                manager = BlockManager(NUM_BLOCKS, BLOCK_SIZE, True, pool=pool)
                cache = PagedKVCache.from_spec(
                    runner.kv_spec(),
                    NUM_BLOCKS,
                    block_size=BLOCK_SIZE,
                    device="cpu",
                    manager=manager,
                )
                engine = LLMEngine(
                    runner, cache, SchedulerConfig(max_num_seqs=4), clock=ManualClock(0.1)
                )
                for index, prompt in enumerate(prompts):  # the first alone, the rest after it
                    engine.add_request(str(index), prompt, params, arrival_time=0.15 * (index > 0))
                engines[name] = engine
            failure = run_side_by_side(engines["yours"], engines["kvlab"], len(prompts))
    except Exception as error:  # noqa: BLE001 - the learner's pool inside the engine
        return engine_stopped(error)
    if failure is not None:
        return failure
    hits = {name: e.scheduler.num_prompt_tokens_hit for name, e in engines.items()}
    if hits["yours"] != hits["kvlab"]:
        return Verdict(
            "generation",
            False,
            f"your pool served {hits['yours']} prompt tokens "
            f"from the cache, kvlab's {hits['kvlab']}",
            "match_prefix and cache must find what kvlab's find",
        )
    return Verdict(
        "generation",
        True,
        f"{len(prompts)} requests, the same K/V and tokens as "
        f"kvlab's, {hits['kvlab']} prompt tokens served from your cache",
    )
