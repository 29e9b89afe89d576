"""Sampling: parameter checks, the sampler's math against softmax, per-request seeds, and
n > 1 samples forked from one prompt's blocks."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import random_prompts

from kvlab import LLM, SamplingParams
from kvlab.engine.request import Request
from kvlab.engine.sampler import make_generator, sample, sampling_probs

pytestmark = pytest.mark.usefixtures("one_thread")


def req(params: SamplingParams, seed: int | None = None) -> Request:
    r = Request("r", 0, [1], params)
    if seed is not None:
        r.generator = make_generator(seed)
    return r


# ---- SamplingParams ------------------------------------------------------------------------


def test_defaults_are_vllm_defaults():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.max_tokens, p.n) == (1.0, -1, 1.0, 16, 1)
    assert not p.greedy and SamplingParams(temperature=0).greedy
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"temperature": -0.5}, "temperature=-0.5"),
        ({"temperature": math.nan}, "temperature=nan"),
        ({"top_p": 0.0}, "top_p=0.0"),
        ({"top_p": 1.5}, "top_p=1.5"),
        ({"top_k": -2}, "top_k=-2"),
        ({"top_k": 2.5}, "top_k=2.5"),
        ({"max_tokens": 0}, "max_tokens=0"),
        ({"max_tokens": -3}, "max_tokens=-3"),
        ({"n": 0}, "n=0"),
        ({"seed": "7"}, "seed='7'"),
        ({"ignore_eos": 1}, "ignore_eos=1"),
        ({"stop_token_ids": [-1]}, "stop_token_ids=\\[-1\\]"),
    ],
)
def test_bad_params_name_the_parameter_value_and_what_is_allowed(kwargs, name):
    with pytest.raises(ValueError, match=f"SamplingParams.{name} is not allowed: use "):
        SamplingParams(**kwargs)


# ---- the sampler's math --------------------------------------------------------------------


def test_greedy_rows_take_the_argmax():
    logits = torch.tensor([[0.1, 3.0, 0.2], [5.0, 1.0, 0.0]])
    greedy = SamplingParams(temperature=0)
    assert sample(logits, [req(greedy), req(greedy)]) == [1, 0]


def test_probs_follow_temperature_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.1]]))
    probs = sampling_probs(logits, [req(SamplingParams(temperature=1.0))])
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.3, 0.1, 0.1]]))
    hot = sampling_probs(logits, [req(SamplingParams(temperature=2.0))])
    torch.testing.assert_close(hot, torch.softmax(logits / 2, dim=-1))
    top2 = sampling_probs(logits, [req(SamplingParams(top_k=2))])
    torch.testing.assert_close(top2, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    # top_p: the smallest set of most likely tokens whose mass reaches p
    nucleus = sampling_probs(logits, [req(SamplingParams(top_p=0.75))])
    torch.testing.assert_close(nucleus, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    wider = sampling_probs(logits, [req(SamplingParams(top_p=0.85))])
    assert (wider > 0).sum() == 3
    tiny_p = sampling_probs(logits, [req(SamplingParams(top_p=0.01))])
    torch.testing.assert_close(tiny_p, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


def test_rows_keep_their_own_settings():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.1]] * 2))
    probs = sampling_probs(logits, [req(SamplingParams(top_k=1)), req(SamplingParams())])
    torch.testing.assert_close(probs[0], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(probs[1], torch.tensor([0.5, 0.3, 0.1, 0.1]))


def test_draws_follow_the_distribution():
    target = torch.tensor([0.6, 0.25, 0.1, 0.05])
    r = req(SamplingParams(temperature=1.0), seed=0)
    counts = torch.zeros(4)
    logits = target.log()[None]
    for _ in range(4000):
        counts[sample(logits, [r])[0]] += 1
    torch.testing.assert_close(counts / 4000, target, atol=0.03, rtol=0)


def test_a_seeded_draw_does_not_depend_on_the_other_rows():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.8, top_p=0.9)
    alone = sample(logits[1:2], [req(params, seed=42)])
    others = [req(SamplingParams(temperature=1.0), seed=s) for s in (1, 2)]
    mixed = sample(logits, [others[0], req(params, seed=42), others[1]])
    assert mixed[1] == alone[0]


# ---- through the engine ----------------------------------------------------------------------


def generate(model, prompts, params, **kwargs):
    llm = LLM(model, num_blocks=kwargs.pop("num_blocks", 128), block_size=4, **kwargs)
    return llm, llm.generate(prompts, params, use_tqdm=False)


def test_seeded_requests_are_reproducible_whatever_shares_their_batch(tiny):
    prompts = random_prompts(tiny.config.vocab_size, [9, 4, 21, 13])
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=40, max_tokens=12, seed=11)
    _, alone = generate(tiny, prompts[:1], params)
    others = SamplingParams(temperature=1.0, max_tokens=20)  # unseeded neighbours
    _, crowd = generate(tiny, prompts, [params, others, others, others], max_num_seqs=4)
    _, late = generate(tiny, prompts[::-1], [others, others, others, params], max_num_seqs=2)
    tokens = alone[0].outputs[0].token_ids
    assert crowd[0].outputs[0].token_ids == tokens
    assert late[3].outputs[0].token_ids == tokens


def test_unseeded_requests_follow_the_engine_seed(tiny):
    prompts = random_prompts(tiny.config.vocab_size, [5, 6])
    params = SamplingParams(temperature=1.0, max_tokens=8)
    runs = [generate(tiny, prompts, params, seed=s)[1] for s in (0, 0, 1)]
    tokens = [[o.outputs[0].token_ids for o in run] for run in runs]
    assert tokens[0] == tokens[1] and tokens[0] != tokens[2]


def test_n_samples_fork_the_prompt_blocks(tiny):
    prompt = random_prompts(tiny.config.vocab_size, [18])[0]  # 4 full blocks + 2 tokens
    params = SamplingParams(n=3, temperature=1.0, max_tokens=6, seed=5)
    llm = LLM(tiny, num_blocks=64, block_size=4)
    llm.engine.add_request("fork", prompt, params)
    llm.engine.step()  # prefill, then the fork
    cache = llm.engine.cache
    samples = llm.engine._samples["fork"]
    tables = [cache.block_table(s.seq_id) for s in samples]
    assert len(samples) == 3
    assert tables[0][:4] == tables[1][:4] == tables[2][:4]  # shared full blocks
    # the partly filled 5th block was copied on write by each child's first decode
    assert len({t[4] for t in tables}) == 1  # not yet: nothing was written after the fork
    llm.engine.step()
    tables = [cache.block_table(s.seq_id) for s in samples]
    assert len({t[4] for t in tables}) == 3
    assert all(cache.manager.pool.ref_cnt[b] == 3 for b in tables[0][:4])
    while llm.engine.has_unfinished_requests():
        llm.engine.step()


def test_sample_i_of_n_equals_one_sample_seeded_seed_plus_i(tiny):
    prompt = random_prompts(tiny.config.vocab_size, [10])[0]
    base = dict(temperature=0.8, top_p=0.95, max_tokens=10)
    _, forked = generate(tiny, [prompt], SamplingParams(n=3, seed=100, **base))
    assert [c.index for c in forked[0].outputs] == [0, 1, 2]
    for i, completion in enumerate(forked[0].outputs):
        _, single = generate(tiny, [prompt], SamplingParams(seed=100 + i, **base))
        assert completion.token_ids == single[0].outputs[0].token_ids
    assert forked[0].finished and forked[0].metrics.num_output_tokens == 30


def test_greedy_n_samples_are_identical(tiny):
    prompt = random_prompts(tiny.config.vocab_size, [7])[0]
    _, out = generate(tiny, [prompt], SamplingParams(n=2, temperature=0, max_tokens=9))
    _, one = generate(tiny, [prompt], SamplingParams(temperature=0, max_tokens=9))
    assert [c.token_ids for c in out[0].outputs] == [one[0].outputs[0].token_ids] * 2


def test_n_samples_on_a_contiguous_cache_copy_the_prompt(tiny):
    prompt = random_prompts(tiny.config.vocab_size, [7])[0]
    params = SamplingParams(n=3, temperature=1.0, max_tokens=5, seed=3)
    _, paged_out = generate(tiny, [prompt], params)
    _, contiguous_out = generate(tiny, [prompt], params, kv_cache="contiguous", max_model_len=64)
    assert [c.token_ids for c in paged_out[0].outputs] == [
        c.token_ids for c in contiguous_out[0].outputs
    ]
