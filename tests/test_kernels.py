"""The Triton kernels equal their torch references (kvlab.kernels.reference).

Without CUDA the kernels run in Triton's interpreter, which is slow, so each case is small
(two sequences, one or two KV heads, short contexts) and the cases are a chosen list that
covers every block size, GQA ratio, head_dim and dtype at least once, not their product.
Block tables are always shuffled, and contexts mostly not multiples of the block size.
On a CUDA machine the same tests run the compiled kernels.
"""

import kvlab.kernels
import pytest
import torch
from kvlab.kernels import (
    paged_decode_attention,
    paged_decode_attention_ref,
    paged_prefill_attention,
    paged_prefill_attention_ref,
    write_kv,
    write_kv_ref,
)
from kvlab.kernels.cases import shuffled_paged_cache

from kvlab.env import default_device

DEVICE = default_device()
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
# Attention outputs are averages of values of magnitude ~1; the kernels round p to the
# storage dtype before the p @ V product, as flash attention does.
TOLERANCE = {F32: 1e-5, F16: 4e-3, BF16: 3e-2}


def make_paged_cache(seq_lens, block_size, num_kv_heads, head_dim, dtype, seed=0):
    """A random cache whose blocks are handed out in shuffled order, plus the block_table.

    Two spare blocks are never referenced, and unused block_table entries hold garbage
    (-7): the kernels must read only a sequence's first ceil(seq_len / block_size) entries.
    """
    return shuffled_paged_cache(
        seq_lens,
        block_size,
        num_kv_heads,
        head_dim,
        num_spare=2,
        extra_columns=1,
        unused_entry=-7,
        dtype=dtype,
        device=DEVICE,
        seed=seed,
    )


def random_tensor(*shape, dtype, seed=1):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def assert_close(actual, expected, dtype):
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


# (dtype, block_size, group, head_dim, num_kv_heads, seq_lens, num_splits)
DECODE_CASES = [
    (F32, 16, 1, 64, 2, [37, 5], 1),
    (F32, 1, 3, 64, 1, [23, 9], 1),
    (F16, 8, 4, 128, 2, [45, 17], 1),
    (BF16, 32, 8, 64, 1, [70, 33], 1),
    (F16, 64, 3, 128, 1, [130, 1], 1),  # several tiles; a context of one token
    (F32, 16, 4, 128, 2, [150, 40], 3),  # split-K
    (BF16, 8, 1, 64, 2, [100, 7], 4),  # split-K; the short sequence leaves splits empty
    (F16, 1, 8, 64, 1, [66, 3], 2),
    (F32, 64, 3, 64, 1, [64, 65], 5),  # exact multiple of the block size, and one past it
    (F32, 16, 2, 80, 1, [29, 50], 1),  # head_dim that is not a power of two
]


@pytest.mark.parametrize(
    "dtype, block_size, group, head_dim, num_kv_heads, seq_lens, num_splits", DECODE_CASES
)
def test_decode_matches_reference(
    dtype, block_size, group, head_dim, num_kv_heads, seq_lens, num_splits
):
    kv_cache, block_table, lens = make_paged_cache(
        seq_lens, block_size, num_kv_heads, head_dim, dtype
    )
    query = random_tensor(len(seq_lens), num_kv_heads * group, head_dim, dtype=dtype)
    out = paged_decode_attention(query, kv_cache, block_table, lens, num_splits=num_splits)
    expected = paged_decode_attention_ref(query, kv_cache, block_table, lens)
    assert out.shape == query.shape and out.dtype == dtype
    assert_close(out, expected, dtype)


def test_decode_split_k_equals_no_split():
    kv_cache, block_table, lens = make_paged_cache([200, 90], 16, 1, 64, F32)
    query = random_tensor(2, 4, 64, dtype=F32)
    one = paged_decode_attention(query, kv_cache, block_table, lens, scale=0.3)
    split = paged_decode_attention(query, kv_cache, block_table, lens, scale=0.3, num_splits=3)
    torch.testing.assert_close(split, one, atol=1e-5, rtol=1e-5)
    expected = paged_decode_attention_ref(query, kv_cache, block_table, lens, scale=0.3)
    torch.testing.assert_close(one, expected, atol=1e-5, rtol=1e-5)


# (dtype, block_size, group, head_dim, num_kv_heads, query_lens, context_lens)
PREFILL_CASES = [
    (F32, 16, 1, 64, 2, [5, 17], [0, 30]),  # a fresh prefill beside a chunked one
    (F16, 1, 3, 64, 1, [20, 1], [3, 40]),  # a decode row inside a prefill batch
    (BF16, 8, 4, 128, 1, [30], [70]),
    (F32, 64, 8, 64, 1, [9, 3], [0, 100]),
    (F16, 32, 1, 128, 1, [70, 2], [0, 5]),  # 70 rows: more than one query tile
]


@pytest.mark.parametrize(
    "dtype, block_size, group, head_dim, num_kv_heads, query_lens, context_lens", PREFILL_CASES
)
def test_prefill_matches_reference(
    dtype, block_size, group, head_dim, num_kv_heads, query_lens, context_lens
):
    seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
    kv_cache, block_table, lens = make_paged_cache(
        seq_lens, block_size, num_kv_heads, head_dim, dtype
    )
    query_start_loc = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()])
    query_start_loc = query_start_loc.to(DEVICE, torch.int32)
    query = random_tensor(sum(query_lens), num_kv_heads * group, head_dim, dtype=dtype)
    out = paged_prefill_attention(query, kv_cache, block_table, lens, query_start_loc)
    expected = paged_prefill_attention_ref(query, kv_cache, block_table, lens, query_start_loc)
    assert out.shape == query.shape and out.dtype == dtype
    assert_close(out, expected, dtype)


def test_prefill_of_one_token_per_sequence_is_decode():
    kv_cache, block_table, lens = make_paged_cache([33, 12, 1], 8, 2, 64, F32)
    query = random_tensor(3, 4, 64, dtype=F32)
    query_start_loc = torch.arange(4, dtype=torch.int32, device=DEVICE)
    prefill = paged_prefill_attention(query, kv_cache, block_table, lens, query_start_loc)
    decode = paged_decode_attention(query, kv_cache, block_table, lens)
    torch.testing.assert_close(prefill, decode, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "cache_dtype, input_dtype, block_size",
    [(F32, F32, 16), (F16, F16, 1), (BF16, BF16, 8), (BF16, F32, 64)],
)
def test_write_kv_matches_reference(cache_dtype, input_dtype, block_size):
    num_blocks, num_kv_heads, head_dim, num_tokens = 12, 3, 64, 9
    kv_cache = torch.zeros(2, num_blocks, block_size, num_kv_heads, head_dim, dtype=cache_dtype)
    kv_cache = kv_cache.to(DEVICE)
    expected = kv_cache.clone()
    key = random_tensor(num_tokens, num_kv_heads, head_dim, dtype=input_dtype, seed=2)
    value = random_tensor(num_tokens, num_kv_heads, head_dim, dtype=input_dtype, seed=3)
    generator = torch.Generator().manual_seed(4)
    slot_mapping = torch.randperm(num_blocks * block_size, generator=generator)[:num_tokens]
    slot_mapping[2] = -1  # a padding token: nothing written
    slot_mapping = slot_mapping.to(DEVICE)
    write_kv(key, value, kv_cache, slot_mapping)
    write_kv_ref(key, value, expected, slot_mapping)
    assert torch.equal(kv_cache, expected)


def test_write_then_decode_reads_the_new_token():
    """The engine's order: write the step's K/V, then attend over the cache including it."""
    kv_cache, block_table, lens = make_paged_cache([20], 8, 1, 64, F32)
    new_key = random_tensor(1, 1, 64, dtype=F32, seed=5) * 10
    new_value = random_tensor(1, 1, 64, dtype=F32, seed=6)
    last = 19  # position of the newest token
    slot = block_table[0, last // 8].long() * 8 + last % 8
    write_kv(new_key, new_value, kv_cache, slot.view(1))
    query = new_key.repeat(1, 2, 1)  # a query equal to the new key attends mostly to it
    out = paged_decode_attention(query, kv_cache, block_table, lens)
    torch.testing.assert_close(
        out, paged_decode_attention_ref(query, kv_cache, block_table, lens), atol=1e-5, rtol=1e-5
    )
    assert torch.allclose(out[0, 0], new_value[0, 0], atol=1e-2)


# --- input checks: each error names the parameter, the value found and what is allowed ---


def decode_inputs(**changes):
    kv_cache, block_table, lens = make_paged_cache([10, 4], 4, 2, 64, F32)
    inputs = dict(
        query=random_tensor(2, 4, 64, dtype=F32),
        kv_cache=kv_cache,
        block_table=block_table,
        seq_lens=lens,
    )
    inputs.update(changes)
    return inputs


# (what is wrong, how to break a good input, error type, message)
DECODE_ERRORS = [
    ("int64 block_table", dict(block_table=lambda t: t.long()), TypeError,
     "block_table must have dtype torch.int32"),
    ("int64 seq_lens", dict(seq_lens=lambda t: t.long()), TypeError,
     "seq_lens must have dtype torch.int32"),
    ("fp16 cache, fp32 query", dict(kv_cache=lambda t: t.half()), TypeError,
     "kv_cache dtype torch.float16 must match"),
    ("no values in cache", dict(kv_cache=lambda t: t[:1]), ValueError,
     r"kv_cache must have shape \(2, num_blocks"),
    ("2-D query", dict(query=lambda t: t[0]), ValueError, "query must have 3 dimensions"),
    ("3 heads, 2 KV heads", dict(query=lambda t: t[:, :3]), ValueError,
     r"num_heads \(3, query.shape\[1\]\) must be a multiple of num_kv_heads \(2"),
    ("short block_table", dict(block_table=lambda t: t[:1]), ValueError,
     r"block_table.shape\[0\] must be 2"),
    ("empty sequence", dict(seq_lens=lambda t: t * 0), ValueError,
     r"seq_lens must lie in .*, got values from 0 to 0"),
    ("sequence past its table", dict(seq_lens=lambda t: t * 4), ValueError,
     r"seq_lens must lie in .* = \[1, 16\], got values from 16 to 40"),
    ("block id past num_blocks", dict(block_table=lambda t: t.clone().fill_(99)), ValueError,
     r"block_table entries in use must lie in .* = \[0, 6\), got values from 99 to 99"),
]  # fmt: skip


@pytest.mark.parametrize(
    "change, error, message",
    [case[1:] for case in DECODE_ERRORS],
    ids=[c[0] for c in DECODE_ERRORS],
)
def test_decode_rejects_bad_inputs(change, error, message):
    inputs = decode_inputs()
    inputs.update({name: breaks(inputs[name]) for name, breaks in change.items()})
    with pytest.raises(error, match=f"paged_decode_attention: {message}"):
        paged_decode_attention(**inputs)


def test_decode_rejects_bad_num_splits_and_scale():
    with pytest.raises(ValueError, match="num_splits must be an int >= 1.*got 0"):
        paged_decode_attention(**decode_inputs(), num_splits=0)
    with pytest.raises(ValueError, match="scale must be None .* or a positive number, got -1.0"):
        paged_decode_attention(**decode_inputs(), scale=-1.0)


def test_check_values_false_skips_only_the_value_checks():
    good = decode_inputs()
    paged_decode_attention(**{**good, "seq_lens": good["seq_lens"] * 0 + 1}, check_values=False)
    with pytest.raises(TypeError, match="block_table must have dtype torch.int32"):
        paged_decode_attention(
            **{**good, "block_table": good["block_table"].long()}, check_values=False
        )


def test_prefill_rejects_bad_inputs():
    kv_cache, block_table, lens = make_paged_cache([10, 4], 4, 2, 64, F32)
    query = random_tensor(6, 4, 64, dtype=F32)
    good = dict(query=query, kv_cache=kv_cache, block_table=block_table, seq_lens=lens)

    def starts(*values):
        return torch.tensor(values, dtype=torch.int32, device=DEVICE)

    with pytest.raises(
        ValueError, match="query_start_loc must start at 0 and end at num_tokens = 6"
    ):
        paged_prefill_attention(**good, query_start_loc=starts(0, 3, 5))
    with pytest.raises(ValueError, match="sequence 1 has query_len 5 and seq_len 4"):
        paged_prefill_attention(**good, query_start_loc=starts(0, 1, 6))
    with pytest.raises(ValueError, match=r"query_start_loc.shape\[0\] must be 3"):
        paged_prefill_attention(**good, query_start_loc=starts(0, 6))
    with pytest.raises(TypeError, match="query_start_loc must have dtype torch.int32"):
        paged_prefill_attention(**good, query_start_loc=starts(0, 3, 6).long())


def test_write_kv_rejects_bad_inputs():
    kv_cache = torch.zeros(2, 3, 4, 2, 64, device=DEVICE)
    key = torch.zeros(2, 2, 64, device=DEVICE)
    slots = torch.tensor([0, 12], device=DEVICE)
    with pytest.raises(ValueError, match="write_kv: slot_mapping values must be < .* = 12"):
        write_kv(key, key, kv_cache, slots)
    with pytest.raises(TypeError, match="write_kv: slot_mapping must have dtype torch.int64"):
        write_kv(key, key, kv_cache, slots.int())
    with pytest.raises(ValueError, match=r"write_kv: key must have shape .*\(num_tokens, 2, 64\)"):
        write_kv(key[:, :1], key[:, :1], kv_cache, slots)


@pytest.mark.skipif(DEVICE.type == "cuda", reason="the error is about CPU tensors")
def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    monkeypatch.setattr(kvlab.kernels._common, "RUNS_IN_INTERPRETER", False)
    with pytest.raises(RuntimeError, match="Triton compiles kernels for CUDA only"):
        paged_decode_attention(**decode_inputs())


def test_import_refuses_a_triton_that_cannot_be_interpreted(monkeypatch):
    """triton imported before TRITON_INTERPRET=1 leaves compiled-mode helpers: a clear error."""
    import triton.language as tl

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(tl, "sum", object())  # what a compiled-mode helper looks like to us
    with pytest.raises(ImportError, match="triton was imported before that variable was set"):
        kvlab.kernels._choose_triton_mode()
