"""Lab 06's build-it in the real engine: a learner's block pool serves the prefix cache.

``check_generation`` serves SmolLM2 requests that share one system prompt, prefix caching
on, twice and side by side: once from the learner's pool (``LLM(block_pool=...)``, through
``LearnerPool``), once from kvlab's own. The first request arrives alone;
the others arrive after its prefill, so their system prompt is found in the cache. After
every step each sequence's K/V, read through its block table, must be the same in both
engines; at the end every token, and the number of prompt tokens the cache served.

Not handled: eviction under memory pressure in the engine (the property checks cover it).
"""

from __future__ import annotations

from kvlab.exercises.block_manager_engine import run_side_by_side
from kvlab.exercises.grading import Verdict, chat_prompts, engine_stopped, one_torch_thread
from kvlab.exercises.learner_pool import LearnerPool

SYSTEM = "You are a helpful assistant. Answer in one short sentence, and be precise."


def check_generation(pool_class, model=None, tokenizer=None) -> Verdict:
    """Serve requests with one system prompt through the learner's pool, against kvlab's."""
    from kvlab.engine.llm import LLM
    from kvlab.engine.metrics import ManualClock
    from kvlab.engine.sampling_params import SamplingParams
    from kvlab.model.loading import load_model

    if model is None:
        model, tokenizer = load_model("smollm2-135m", device="cpu")
    if tokenizer is None:
        raise ValueError("check_generation needs the model's tokenizer (for the chat prompts)")
    prompts = chat_prompts(tokenizer, system=SYSTEM)
    params = SamplingParams(temperature=0, max_tokens=8)
    try:
        with one_torch_thread():
            engines = {}
            for name in ("yours", "kvlab"):
                llm = LLM(
                    model,
                    tokenizer=tokenizer,
                    num_blocks=64,
                    block_size=8,
                    max_num_seqs=4,
                    device="cpu",
                    clock=ManualClock(0.1),
                    block_pool=(lambda n: LearnerPool(pool_class(n))) if name == "yours" else None,
                )
                for index, prompt in enumerate(prompts):  # the first alone, the rest after it
                    llm.engine.add_request(
                        str(index), prompt, params, arrival_time=0.15 * (index > 0)
                    )
                engines[name] = llm.engine
            failure = run_side_by_side(engines["yours"], engines["kvlab"], len(prompts))
    except Exception as error:  # noqa: BLE001 - the learner's pool inside the engine
        return engine_stopped(error)
    if failure is not None:
        return failure
    hits = {name: e.scheduler.num_prompt_tokens_hit for name, e in engines.items()}
    if hits["yours"] != hits["kvlab"]:
        detail = f"your pool served {hits['yours']} prompt tokens from the cache, kvlab's"
        why = "match_prefix and cache must find what kvlab's find"
        return Verdict("generation", False, f"{detail} {hits['kvlab']}", why)
    detail = f"{len(prompts)} requests, the same K/V and tokens as kvlab's, {hits['kvlab']}"
    return Verdict("generation", True, f"{detail} prompt tokens served from your cache")
