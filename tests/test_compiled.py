"""The compiled runner (``kvlab.model.compiled``) against its oracle, the eager runner.

Greedy tokens must be identical (inductor's fused RMSNorm and SiLU may round the last bit
differently, so logits are compared with a tolerance), on the tiny models and on SmolLM2,
and the token dimension must be dynamic: a second batch size compiles nothing new.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import paged_greedy, random_prompts, served_by_flag, tokens_match_eager

import kvlab
from kvlab.attention import fastest_backend
from kvlab.cache.base import ForwardBatch
from kvlab.cache.paged import PagedKVCache
from kvlab.model.compiled import CompiledRunner, compile_unavailable
from kvlab.model.loading import chat_prompt
from kvlab.model.runner import ModelRunner

pytestmark = pytest.mark.skipif(
    compile_unavailable() is not None, reason=f"no torch.compile: {compile_unavailable()}"
)


def unique_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def test_tiny_tokens_match_eager(tiny, one_thread):
    assert tokens_match_eager(CompiledRunner, tiny)


def test_tiny_logits_close_to_eager(tiny, one_thread):
    prompt = random_prompts(tiny.config.vocab_size, [9])[0]
    logits = []
    for runner in (ModelRunner(tiny), CompiledRunner(tiny)):
        cache = PagedKVCache.from_spec(runner.kv_spec(), num_blocks=4, block_size=16)
        cache.allocate_slots(0, len(prompt))
        batch = ForwardBatch.build([0], [0], [len(prompt)])
        logits.append(runner.forward(torch.tensor(prompt), batch, cache))
    torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=1e-4)


def test_a_new_batch_size_compiles_nothing(one_thread):
    """Each of the three stretches compiles once, for every batch of more than one row."""
    model, _ = kvlab.load_model("tiny", device="cpu")
    torch._dynamo.reset()
    runner = CompiledRunner(model)
    before = unique_graphs()
    paged_greedy(runner, random_prompts(model.config.vocab_size, [5, 11, 3]), 4)
    assert unique_graphs() - before == 3
    paged_greedy(runner, random_prompts(model.config.vocab_size, [8, 2], seed=1), 4)
    assert unique_graphs() - before == 3


def test_smollm2_tokens_match_eager(smollm2, one_thread):
    """Chat prompts stopping at EOS (the batch shrinks as answers end) and plain text."""
    model, tokenizer = smollm2
    backend = fastest_backend("cpu")
    eager, compiled = ModelRunner(model, backend), CompiledRunner(model, backend)
    questions = ["What is the capital of France?", "Write a haiku about memory.",
                 "Explain in two sentences why the sky is blue to a child who asks."]  # fmt: skip
    chats = [chat_prompt(tokenizer, q) for q in questions]
    eos = tokenizer.eos_token_id
    answers = paged_greedy(compiled, chats, 48, eos)
    assert answers == paged_greedy(eager, chats, 48, eos)
    assert tokenizer.decode(answers[0]) == "The capital of France is Paris.<|im_end|>"
    texts = ["Once upon a time, in a small village by the sea,", "The three most important ideas"]
    texts = [tokenizer(t)["input_ids"] for t in texts]
    assert paged_greedy(compiled, texts, 32) == paged_greedy(eager, texts, 32)


def test_decode_step_benchmark_times_the_compiled_step(tiny_model, one_thread):
    from kvlab.measure.decode_step import COMPILED, CUSTOM_OPS, METHODS, decode_step_times
    from kvlab.model import custom_ops

    times = decode_step_times(tiny_model, batch_size=3, context=9, rounds=2, block_size=4,
                              compiled=True)  # fmt: skip
    custom = {CUSTOM_OPS} if custom_ops.available() else set()
    assert set(times) == {*METHODS, COMPILED, "compile", *custom}
    assert all(times[name] > 0 for name in (*METHODS, COMPILED))


def test_llm_compile_serves_the_same_tokens(tiny, one_thread):
    """``LLM(compile=True)`` through the engine: requests join and leave the batch (three
    seats, five prompts), and every token equals the eager engine's."""
    from kvlab import LLM

    runs = served_by_flag(tiny, "compile", CompiledRunner)
    assert runs[True] == runs[False]
    with pytest.raises(ValueError, match="compile='yes' is not allowed"):
        LLM(tiny, num_blocks=8, compile="yes")


def test_importing_kvlab_registers_no_op():
    """The compiled runner defines ``kvlab::linear`` when imported; a plain ``import kvlab``
    (or the engine) must not import it."""
    code = (
        "import sys, kvlab, kvlab.engine.llm, kvlab.measure.decode_step\n"
        "assert 'kvlab.model.compiled' not in sys.modules, 'imported at import time'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
