"""The C paged decode kernel equals the torch reference, and the "cpu" backend runs the engine.

The kernel is built by the machine's C compiler on first use; on a machine without one
these tests skip (``test_native.py`` checks the message a user then gets).
"""

import re

import pytest
import torch
from kvlab.kernels import paged_decode_attention_ref
from kvlab.kernels.cases import random_query, shuffled_paged_cache

from kvlab import LLM, SamplingParams
from kvlab.attention import cpu_kernel
from kvlab.attention.cpu_kernel import paged_decode_attention_cpu

needs_kernel = pytest.mark.skipif(
    not cpu_kernel.available(), reason="no C compiler could build the CPU kernel"
)

# (block_size, group, head_dim, num_kv_heads, seq_lens): shuffled pools, contexts mostly
# not multiples of the block size, one-token contexts, exact multiples and one past them.
CASES = [
    (16, 1, 64, 2, [37, 5]),
    (1, 3, 64, 1, [23, 9]),  # block_size 1: a contiguous cache's "blocks"
    (8, 4, 128, 2, [45, 17, 1]),
    (32, 3, 64, 3, [64, 65, 96, 2]),  # SmolLM2's heads
    (64, 8, 80, 1, [130, 1]),  # head_dim not a power of two; several blocks
    (256, 16, 256, 1, [300, 256]),  # the kernel's largest block, group and head_dim
]


@needs_kernel
@pytest.mark.parametrize("block_size, group, head_dim, num_kv_heads, seq_lens", CASES)
def test_kernel_matches_reference(block_size, group, head_dim, num_kv_heads, seq_lens):
    kv, table, lens = shuffled_paged_cache(
        seq_lens, block_size, num_kv_heads, head_dim, extra_columns=1, unused_entry=-7
    )
    query = random_query(len(seq_lens), num_kv_heads * group, head_dim)
    out = paged_decode_attention_cpu(query, kv, table.long(), lens.long(), block_size, 0.3)
    expected = paged_decode_attention_ref(query, kv, table, lens, scale=0.3)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_threads_do_not_change_the_result(threads):
    kv, table, lens = shuffled_paged_cache([50, 7, 33], 16, 2, 64)
    query = random_query(3, 6, 64)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        out = paged_decode_attention_cpu(query, kv, table.long(), lens.long(), 16, 0.125)
    finally:
        torch.set_num_threads(before)
    expected = paged_decode_attention_ref(query, kv, table, lens, scale=0.125)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize(
    "change, message",
    [
        (dict(query=torch.zeros(2, 4, 16, dtype=torch.float16)), "query as torch.float32"),
        (dict(block_ids=torch.zeros(2, 3, dtype=torch.int32)), "block_ids as torch.int64"),
        (dict(seq_lens=torch.tensor([5, 13])), r"seq_lens\[1\] = 13: .* = 3 \* 4 tokens"),
        (dict(seq_lens=torch.tensor([0, 3])), r"seq_lens\[0\] = 0"),
        (dict(seq_lens=torch.tensor([5])), "one row per query"),
        (dict(block_ids=torch.tensor([[0, 8, 0], [1, 2, 3]])), r"block_ids\[0\] reads .*0\.\.7"),
        (dict(block_ids=torch.tensor([[0, 1, 2], [-1, 2, 3]])), r"block_ids\[1\] reads"),
        (dict(kv=torch.zeros(2, 8, 4, 16, 2).transpose(-1, -2)), "kv must be contiguous"),
        (dict(kv=torch.zeros(2, 8, 8, 2, 16)), "kv must be one layer's cache"),
        (dict(kv=torch.zeros(8, 4, 2, 16)), "kv must be one layer's cache"),
        (dict(query=torch.zeros(2, 34, 16)), r"num_heads // num_kv_heads up to 16, got 17"),
        (dict(query=torch.zeros(2, 4, 8)), "head_dim equal"),
    ],
)
def test_bad_input_is_refused_with_what_was_wrong(change, message):
    args = dict(
        query=torch.zeros(2, 4, 16),
        kv=torch.zeros(2, 8, 4, 2, 16),  # 8 blocks of 4 slots, 2 kv heads, head_dim 16
        block_ids=torch.tensor([[0, 1, 2], [3, 4, 5]]),
        seq_lens=torch.tensor([5, 12]),
    )
    args.update(change)
    with pytest.raises(ValueError, match=message):
        paged_decode_attention_cpu(**args, block_size=4, scale=1.0)


@needs_kernel
def test_unused_block_table_entries_are_never_read():
    """Past a sequence's last block the table may hold anything (here -1 and 99)."""
    kv = torch.randn(2, 8, 4, 2, 16)
    query = torch.randn(2, 4, 16)
    block_ids = torch.tensor([[3, -1, 99], [5, 6, 99]])
    out = paged_decode_attention_cpu(query, kv, block_ids, torch.tensor([4, 6]), 4, 0.25)
    table = block_ids.clamp(0, 7).int()
    expected = paged_decode_attention_ref(query, kv, table, torch.tensor([4, 6]).int(), 0.25)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_the_buffer_limits_agree_with_the_c_source():
    source = cpu_kernel.LIBRARY.source.read_text()
    for name in ("MAX_GROUP", "MAX_BLOCK", "MAX_HEAD_DIM"):
        defined = re.search(rf"^#define {name} (\d+)\b", source, re.MULTILINE)
        assert defined and int(defined.group(1)) == getattr(cpu_kernel, name)


@needs_kernel
@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_cpu_backend_gives_the_sdpa_backend_tokens(tiny, kv_cache):
    """Prefill, chunked prefill and decode rows in the same steps, through the engine."""
    prompts = [[5 + i for i in range(n)] for n in (3, 17, 9, 30)]
    params = SamplingParams(temperature=0, max_tokens=12)
    results = {}
    for backend in ("sdpa", "cpu"):
        llm = LLM(
            tiny, kv_cache=kv_cache, attention_backend=backend, block_size=4, num_blocks=64,
            max_num_seqs=3, max_num_batched_tokens=16, max_model_len=64,
        )  # fmt: skip
        outputs = llm.generate(prompts, params, use_tqdm=False)
        results[backend] = [o.outputs[0].token_ids for o in outputs]
    assert results["cpu"] == results["sdpa"]
