"""The C custom ops (``kvlab.model.custom_ops``) against their oracles.

Each op equals the eager runner's PyTorch code for it to float32 rounding; the runner
built on them gives the eager runner's and transformers' greedy tokens, on the tiny
models, on SmolLM2 and through ``LLM(custom_ops=True)``. Built by the machine's C compiler
on first use; without one these tests skip (``test_native.py`` checks the message).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import paged_greedy, served_by_flag, tokens_match_eager
from test_runner import SMOLLM2_QUESTIONS, SMOLLM2_TEXTS, hf_greedy_batch

from kvlab import LLM
from kvlab.attention import fastest_backend
from kvlab.cache.base import ForwardBatch
from kvlab.cache.paged import PagedKVCache
from kvlab.model import custom_ops
from kvlab.model.custom_ops import (
    CustomOpsRunner,
    fused_add_rms_norm,
    rotary_embedding,
    silu_and_mul,
)
from kvlab.model.loading import chat_prompt
from kvlab.model.runner import ModelRunner, apply_rotary, rms_norm

pytestmark = pytest.mark.skipif(
    not custom_ops.available(), reason="no C compiler could build the custom ops"
)
TOLERANCE = {"atol": 2e-6, "rtol": 2e-6}


@pytest.fixture(params=[1, 2], ids=["one thread", "two threads"])
def threads(request):
    previous = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(previous)


@pytest.mark.parametrize("rows", [1, 7, 64])  # 64 x 576: enough for two threads
def test_fused_add_rms_norm_adds_then_normalizes(rows, threads):
    generator = torch.Generator().manual_seed(rows)
    x, residual = torch.randn(2, rows, 576, generator=generator) * 3
    x[0] *= 1e-3  # alone (no residual), row 0 is so small that eps weighs in its norm
    residual[0] = -x[0]  # with the residual, row 0 sums to zero: its norm is 0, not NaN
    weight = torch.randn(576, generator=generator)
    summed = x + residual
    out = fused_add_rms_norm(x, residual, weight, 1e-5)
    torch.testing.assert_close(x, summed, atol=0, rtol=0)  # the add, in place
    torch.testing.assert_close(out, rms_norm(summed, weight, 1e-5), **TOLERANCE)
    alone = fused_add_rms_norm(x.clone(), None, weight, 1e-5, out=torch.empty_like(x))
    torch.testing.assert_close(alone, rms_norm(x, weight, 1e-5), **TOLERANCE)


@pytest.mark.parametrize("rows", [5, 64])  # 64 x 1536: enough for two threads
def test_silu_and_mul_takes_gate_then_up(rows, threads):
    generator = torch.Generator().manual_seed(rows)
    gate_up = torch.randn(rows, 2 * 1536, generator=generator) * 4
    gate_up[0, :4] = torch.tensor([-200.0, -90.0, 90.0, 0.0])  # exp overflows or vanishes
    gate, up = gate_up.split(1536, dim=-1)
    torch.testing.assert_close(silu_and_mul(gate_up), F.silu(gate) * up, **TOLERANCE)


@pytest.mark.parametrize(("rows", "head_dim"), [(6, 64), (6, 80), (64, 64)])  # 64: two threads
def test_rotary_embedding_rotates_q_and_k_in_place_inside_qkv(rows, head_dim, threads):
    """The q|k heads at the front of a q|k|v row: rotated; the v heads behind: untouched."""
    generator = torch.Generator().manual_seed(head_dim)
    qk_heads, v_heads = 12, 3
    qkv = torch.randn(rows, (qk_heads + v_heads) * head_dim, generator=generator)
    angles = torch.rand(rows, head_dim // 2, generator=generator) * 100
    cos, sin = torch.cat([angles, angles], dim=-1).cos(), torch.cat([angles, angles], -1).sin()
    qk = qkv[:, : qk_heads * head_dim].view(rows, qk_heads, head_dim)
    expected, v_before = apply_rotary(qk, cos, sin), qkv[:, qk_heads * head_dim :].clone()
    rotary_embedding(qk, cos, sin)
    torch.testing.assert_close(qk, expected, **TOLERANCE)
    assert torch.equal(qkv[:, qk_heads * head_dim :], v_before)


def test_bad_inputs_name_what_is_wrong():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"weight must be a contiguous float32 CPU tensor.*\(8,\)"):
        fused_add_rms_norm(x, None, torch.ones(9), 1e-5)
    with pytest.raises(ValueError, match="residual must be .*float64"):
        fused_add_rms_norm(x, x.double(), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="x must be .*strides"):
        fused_add_rms_norm(x.t(), None, torch.ones(4), 1e-5)
    with pytest.raises(ValueError, match="even width; got 7"):
        silu_and_mul(torch.randn(3, 7))
    with pytest.raises(ValueError, match=r"out must be .*\(4, 8\).*\(4, 9\)"):
        fused_add_rms_norm(x, None, torch.ones(8), 1e-5, out=torch.empty(4, 9))
    with pytest.raises(ValueError, match=r"x must be \(rows, width\), got shape \(2, 4, 4\)"):
        fused_add_rms_norm(x.view(2, 4, 4), None, torch.ones(4), 1e-5)
    with pytest.raises(ValueError, match=r"gate_up must be \(rows, 2 \* width\)"):
        silu_and_mul(torch.randn(6))
    cos, sin = torch.ones(2, 8), torch.ones(2, 8)
    with pytest.raises(ValueError, match=r"heads must be \(rows, num_heads, head_dim\)"):
        rotary_embedding(torch.randn(2, 24), cos, sin)
    with pytest.raises(ValueError, match=r"sin must be .*\(2, 8\)"):
        rotary_embedding(torch.randn(2, 3, 8), cos, torch.ones(3, 8))


@pytest.mark.parametrize(
    "heads",
    [
        torch.randn(2, 8, 3).transpose(1, 2),  # a row's heads not side by side
        torch.randn(2, 3, 8).half(),  # half the bytes the C code would write
        torch.randn(1, 3, 8).expand(2, 3, 8),  # two rows in the same memory
        torch.empty(2, 3, 8, device="meta"),  # not in CPU memory
        torch.randn(2, 3, 7),  # an odd head_dim: no pairs to rotate
    ],
    ids=["transposed", "float16", "overlapping rows", "meta device", "odd head_dim"],
)
def test_rotary_refuses_heads_the_c_code_cannot_take(heads):
    angles = torch.ones(2, heads.shape[-1])
    with pytest.raises(ValueError, match="heads must be float32 on the CPU, .* even head_dim"):
        rotary_embedding(heads, angles, angles)


def test_tiny_tokens_match_eager(tiny, one_thread):
    assert tokens_match_eager(CustomOpsRunner, tiny)


def test_smollm2_tokens_match_eager_and_transformers(smollm2, one_thread):
    """Chat prompts stopping at EOS (the batch shrinks as answers end) and plain text."""
    model, tokenizer = smollm2
    backend = fastest_backend("cpu")
    eager, fused = ModelRunner(model, backend), CustomOpsRunner(model, backend)
    chats = [chat_prompt(tokenizer, q) for q in SMOLLM2_QUESTIONS]
    eos = tokenizer.eos_token_id
    answers = paged_greedy(fused, chats, 48, eos)
    assert answers == paged_greedy(eager, chats, 48, eos)
    assert answers == hf_greedy_batch(model, chats, 48, eos)
    texts = [tokenizer(t)["input_ids"] for t in SMOLLM2_TEXTS]
    continued = paged_greedy(fused, texts, 32)
    assert continued == paged_greedy(eager, texts, 32) == hf_greedy_batch(model, texts, 32)


def test_smollm2_logits_close_to_eager(smollm2, one_thread):
    """A prefill of chat prompts: the sums in another order move logits by about 1e-4; a
    norm without its eps, say, moves them by 1e-2."""
    model, tokenizer = smollm2
    prompts = [chat_prompt(tokenizer, q) for q in SMOLLM2_QUESTIONS]
    lengths = [len(p) for p in prompts]
    logits = []
    for runner in (ModelRunner(model), CustomOpsRunner(model)):
        cache = PagedKVCache.from_spec(runner.kv_spec(), num_blocks=64, block_size=16)
        for seq_id, length in enumerate(lengths):
            cache.allocate_slots(seq_id, length)
        batch = ForwardBatch.build(list(range(len(prompts))), [0] * len(prompts), lengths)
        ids = torch.tensor([token for prompt in prompts for token in prompt])
        logits.append(runner.forward(ids, batch, cache))
    torch.testing.assert_close(logits[1], logits[0], atol=5e-4, rtol=0)


def test_llm_custom_ops_serves_the_same_tokens(tiny, one_thread):
    """Through the engine: requests join and leave the batch (three seats, five prompts)."""
    runs = served_by_flag(tiny, "custom_ops", CustomOpsRunner)
    assert runs[True] == runs[False]


def test_llm_refuses_what_custom_ops_cannot_run(tiny_model):
    with pytest.raises(ValueError, match="custom_ops=1 is not allowed: use True or False"):
        LLM(tiny_model, num_blocks=8, custom_ops=1)
    with pytest.raises(ValueError, match="compile=True and custom_ops=True are not allowed"):
        LLM(tiny_model, num_blocks=8, custom_ops=True, compile=True)
    with pytest.raises(ValueError, match="float32 models on the CPU, got torch.float64"):
        LLM("tiny", num_blocks=8, dtype=torch.float64, custom_ops=True)
