"""Lab 05's step-by-step kernels (kvlab.kernels.steps) equal the torch reference.

Small cases, shuffled block tables, contexts that end mid-block, GQA groups that are not
powers of two (padded rows), and split-K with splits that get no tokens.
"""

import pytest
import torch
from kvlab.kernels import paged_decode_attention_ref
from kvlab.kernels.cases import random_query, shuffled_paged_cache
from kvlab.kernels.steps import (
    contiguous_decode,
    gqa_paged_decode,
    merge_splits,
    split_paged_decode,
)

import kvlab  # noqa: F401 (before triton: kvlab chooses how Triton runs)
from kvlab.env import default_device

DEVICE = default_device()
TOL = 1e-5

# (seq_lens, block_size, num_heads, num_kv_heads, head_dim)
PAGED_CASES = [
    ([10, 7, 13], 4, 6, 2, 32),
    ([37, 5], 16, 2, 2, 64),
    ([1, 20], 8, 4, 1, 16),
    ([9, 4, 30], 1, 3, 3, 16),
]


def paged(case, seed=0):
    seq_lens, block_size, num_heads, num_kv_heads, head_dim = case
    kv, table, lens = shuffled_paged_cache(
        seq_lens, block_size, num_kv_heads, head_dim, device=DEVICE, seed=seed
    )
    query = random_query(len(seq_lens), num_heads, head_dim, device=DEVICE, seed=seed + 1)
    return query, kv, table, lens


def test_contiguous_decode_matches_softmax_attention():
    gen = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, 21, 2, 32, generator=gen).to(DEVICE)
    query = torch.randn(6, 32, generator=gen).to(DEVICE)
    k, v = keys.repeat_interleave(3, dim=1), values.repeat_interleave(3, dim=1)
    scores = torch.einsum("hd,thd->ht", query, k) * 32**-0.5
    expected = torch.einsum("ht,thd->hd", scores.softmax(-1), v)
    actual = contiguous_decode(query, keys, values)
    assert (actual - expected).abs().max() < TOL


@pytest.mark.parametrize("case", PAGED_CASES)
def test_gqa_paged_decode_matches_reference(case):
    query, kv, table, lens = paged(case)
    expected = paged_decode_attention_ref(query, kv, table, lens)
    assert (gqa_paged_decode(query, kv, table, lens) - expected).abs().max() < TOL


@pytest.mark.parametrize("case", PAGED_CASES)
@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_split_paged_decode_matches_reference(case, num_splits):
    query, kv, table, lens = paged(case)
    expected = paged_decode_attention_ref(query, kv, table, lens)
    out, lse = split_paged_decode(query, kv, table, lens, num_splits)
    assert (out - expected).abs().max() < TOL
    assert lse.shape == (*query.shape[:2], num_splits)


def test_a_split_with_no_tokens_has_lse_minus_infinity_and_weight_zero():
    query, kv, table, lens = paged(([1, 20], 8, 4, 1, 16))
    _, lse = split_paged_decode(query, kv, table, lens, num_splits=3)
    assert torch.isinf(lse[0, :, 1:]).all() and torch.isfinite(lse[1]).all()
    parts = torch.ones(1, 2, 4)
    assert torch.equal(merge_splits(parts, torch.tensor([[0.0, float("-inf")]])), torch.ones(1, 4))
