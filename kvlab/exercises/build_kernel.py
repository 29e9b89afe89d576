"""Build it (lab 05): the one-pass decode kernel's inner loop, in Triton, checked.

The learner completes ``my_decode_kernel`` in lab 05: the program of the two-pass kernel
of section 3 (one query head of one sequence), with its loop over the sequence's logical
blocks left empty. One pass of the loop, written by the learner:

    block  = block_table[seq, logical]            the gather: where this block lives
    k, v   = its keys and values, masked past seq_len
    scores = q . k * scale                        (-inf past seq_len)
    m_new  = max(m_i, max(scores));  alpha = exp(m_i - m_new);  p = exp(scores - m_new)
    l_i    = l_i * alpha + sum(p);   acc = acc * alpha + p @ v;  m_i = m_new

``check_kernel(my_decode_kernel)`` launches it (``decode_with``) on cases that each add one
difficulty (``CASES``), every output row against ``paged_decode_attention_ref``, up to the
first case that fails; then the tiny model decodes with the learner's kernel, and its
tokens must equal the reference backend's.

    hint_kernel(1), (2), (3)   help in steps
    reveal_kernel()            kvlab's own kernel (``kvlab.kernels.paged_attention``)

Not handled: head_dim or block_size that are not powers of two (``tl.arange`` needs them),
split-K, float16.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
import torch

from kvlab.exercises.grading import (
    BuildIt,
    Report,
    Verdict,
    different_requests,
    engine_stopped,
    one_torch_thread,
    plural,
)

CRITERIA = {
    "written": "the loop computes something (the output is no longer 0 / 0)",
    "one_block": "one full block: softmax(q . k * scale) @ v over its slots",
    "kv_heads": "one block of several KV heads: each slot read stride_kv_slot apart, each "
    "query head from its own KV head",
    "online_softmax": "several blocks in order: l_i and acc rescaled by alpha as the max grows",
    "block_table": "blocks scattered over the pool: each read where the block table says",
    "partial_block": "contexts that end mid-block: the slots past seq_len count for nothing",
    "large_scores": "scores in the hundreds, of either sign: exp(score - running max)",
    "shapes": "block sizes 1 to 32, GQA groups 1 to 4, head_dim 16 to 64, up to 4 sequences",
    "generation": "the tiny model decodes through your kernel the reference backend's tokens",
}
TOLERANCE = 1e-5  # float32: the order of the sums changes only the last bits


class Case(NamedTuple):
    """One launch of the learner's kernel, on a random paged cache (``_inputs``)."""

    seq_lens: list[int]
    block_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    shuffled: bool = True  # blocks in random order; else logical block i is physical block i
    query_scale: float = 1.0  # 3: the max grows from block to block; 100: scores in the hundreds
    scores: str = "random"  # or steered (``_steer_scores``): "negative" or "mixed"


# Each criterion adds one difficulty to those before it. Until "shapes", every case has
# block_size 8 and head_dim 16, so a size typed in is first caught there.
CASES = {
    "one_block": [Case([8], 8, 1, 1, 16, shuffled=False)],
    # With one KV head, a slot stride typed as HEAD_DIM is right by chance; two KV heads
    # find it. GQA groups of 1 and 2 find a query head sent to the wrong KV head.
    "kv_heads": [Case([8], 8, 2, 2, 16, shuffled=False), Case([8], 8, 4, 2, 16, shuffled=False)],
    "online_softmax": [
        Case([32], 8, 2, 2, 16, shuffled=False, query_scale=3.0),
        Case([40], 8, 1, 1, 16, shuffled=False, query_scale=3.0),
    ],
    "block_table": [Case([24, 16, 8], 8, 2, 2, 16)],
    "partial_block": [Case([10, 7, 13], 8, 2, 2, 16), Case([1, 5], 8, 1, 1, 16)],
    "large_scores": [
        Case([12, 9], 8, 2, 2, 16, query_scale=100.0),
        # Every score of a row near -300: a running max that starts at 0, or that takes
        # the max before the slots past seq_len are masked, leaves exp(-300) = 0 for every
        # slot, and 0 / 0.
        Case([12, 9], 8, 2, 2, 16, scores="negative"),
        Case([13, 6], 8, 2, 1, 16, scores="mixed"),
    ],
    "shapes": [
        Case([9, 4], 1, 2, 2, 16),
        Case([37, 10, 3], 8, 4, 1, 32),
        Case([50, 17], 16, 4, 2, 64),
        Case([5, 11, 2, 8], 2, 3, 1, 16),
        Case([70, 33], 32, 2, 1, 64),
    ],
}
MISCONCEPTIONS = {
    "one_block": "scores = q . k for each slot, times scale; then p = exp(scores - max), "
    "l_i = sum(p), acc = sum of p * v, and the stored output is acc / l_i",
    "online_softmax": "before a block's p is added, the old l_i and acc must shrink by "
    "alpha = exp(m_i - m_new), and m_i becomes m_new",
    "block_table": "the physical block is tl.load(block_table_ptr + seq * stride_bt_seq + "
    "logical): the logical index is not an address in the pool",
    "partial_block": "load with mask=in_seq (in_seq = logical * BLOCK_SIZE + slots < seq_len) "
    "and give masked slots the score -inf, so that their p is 0",
    "shapes": "use the strides and constexprs the kernel is given (stride_kv_slot, "
    "stride_bt_seq, HEAD_DIM, BLOCK_SIZE): no size typed in",
}
# What a failure of one block of several KV heads means, by the rows it got wrong.
SLOT_STRIDE = (
    "every query head is off, so the slots are read in the wrong places: slot s of a block "
    "starts s * stride_kv_slot elements in, and stride_kv_slot is num_kv_heads * head_dim "
    "(a token's KV heads lie side by side), HEAD_DIM only when there is one KV head"
)
HEAD_MAPPING = (
    "some query heads are right and others off, so heads read the wrong KV head: query "
    "head h reads KV head h // GROUP, at kv_cache_ptr + (head // GROUP) * stride_kv_head"
)
# What a failure of each large-score case means, by how its scores were steered: each names
# an overflow or a 0 / 0, so it is named only when the rows it got wrong are NaN or inf.
LARGE_SCORES = {
    "random": "exponentiate scores minus the running max, never the raw scores (exp(100) is "
    "past float32's range)",
    "negative": "the running max starts at -inf, not 0, and is taken after the slots past "
    "seq_len are set to -inf: else a row whose scores are all near -300 underflows to 0 / 0",
    "mixed": "",  # no mistake we know of fails this case alone: no guess
}
HINTS = (
    "Section 3.2's kernel has everything one block needs: the block-table load, in_seq, the "
    "offsets, the masked loads of k and v, the scores. Copy that into the loop, then replace "
    "its two passes by section 5's five lines: m_new, alpha, p, l_i, acc.",
    "Scores past seq_len must be -inf before the max: scores = tl.where(in_seq, "
    "tl.sum(k * q[None, :], axis=1) * scale, float('-inf')). m_new = tl.maximum(m_i, "
    "tl.max(scores, axis=0)); alpha = tl.exp(m_i - m_new); p = tl.exp(scores - m_new). "
    "On the first block m_i is -inf and alpha is 0: nothing to rescale yet.",
    "Inside the loop, for each logical block:\n"
    "  1. block = tl.load(block_table_ptr + seq * stride_bt_seq + logical).to(tl.int64)\n"
    "  2. in_seq = logical * BLOCK_SIZE + slots < seq_len\n"
    "  3. offsets = block * stride_kv_block + slots[:, None] * stride_kv_slot + dims[None, :]\n"
    "  4. k = tl.load(k_head_ptr + offsets, mask=in_seq[:, None], other=0.0).to(tl.float32)\n"
    "  5. v: the same load from v_head_ptr\n"
    "  6. scores, m_new, alpha and p as in hint 2\n"
    "  7. l_i = l_i * alpha + tl.sum(p, axis=0)\n"
    "  8. acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)\n"
    "  9. m_i = m_new",
)


def decode_with(kernel, query, kv_cache, block_table, seq_lens, scale=None) -> torch.Tensor:
    """Launch a learner's decode kernel, with the arguments of lab 05's
    ``naive_paged_decode_kernel``: one program per (sequence, query head)."""
    num_seqs, num_heads, head_dim = query.shape
    query = query.contiguous()
    out = torch.empty_like(query)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 0 / 0 of an unwritten loop, in the interpreter
        kernel[(num_seqs, num_heads)](
            out,
            query,
            kv_cache,
            block_table,
            seq_lens,
            head_dim**-0.5 if scale is None else scale,
            *kv_cache.stride()[:4],  # kind, block, slot, head
            block_table.stride(0),
            NUM_HEADS=num_heads,
            GROUP=num_heads // kv_cache.shape[3],
            HEAD_DIM=head_dim,
            BLOCK_SIZE=kv_cache.shape[2],
        )
    return out


class KernelCases:
    """The kernel's fixed cases as a ``Search`` (``grading``): criterion by criterion, in
    order, up to the first that fails."""

    def failures(self, kernel, num_cases: int, seed: int):
        for criterion, cases in CASES.items():
            verdict = _check_cases(kernel, criterion, cases)
            if not verdict.passed:
                return {criterion: (verdict.detail, verdict.misconception)}, {}
        return {}, {}


def _kernel_source() -> tuple:
    from kvlab.kernels import paged_attention

    return (paged_attention._paged_decode_kernel.fn,)


# The reveal: kvlab's own decode kernel (tiles of TILE_N tokens, GQA groups, split-K).
KERNEL = BuildIt(
    CRITERIA,
    HINTS,
    stuck="Stuck? hint_kernel(1), then 2 and 3; print(reveal_kernel()) shows kvlab's own kernel.",
    written=lambda kernel: _check_cases(kernel, "written", CASES["one_block"]),
    search=KernelCases(),
    reveal_sources=_kernel_source,
)
hint_kernel, reveal_kernel = KERNEL.hint, KERNEL.reveal


def check_kernel(kernel, model=None) -> Report:
    """Grade a learner's decode kernel, criterion by criterion, then in the tiny model."""
    return KERNEL.check(kernel, lambda: check_generation(kernel, model))


def _check_cases(kernel, criterion: str, cases: list[Case]) -> Verdict:
    from kvlab.kernels import paged_decode_attention_ref

    for number, case in enumerate(cases):
        query, kv_cache, block_table, seq_lens = _inputs(case)
        expected = paged_decode_attention_ref(query, kv_cache, block_table, seq_lens)
        try:
            mine = decode_with(kernel, query, kv_cache, block_table, seq_lens)
        except Exception as error:  # noqa: BLE001 - any error of the learner's kernel
            return Verdict(criterion, False, f"the kernel raised {type(error).__name__}: {error}")
        if criterion == "written":
            if torch.isnan(mine).all():
                return Verdict(
                    "written",
                    False,
                    "every output row is NaN: the loop is not written yet (acc / l_i is "
                    "0 / 0), or it makes NaN",
                    "if the loop is written: p = exp(scores - m_new), with the new max; on the "
                    "first block m_i is -inf, so exp(scores - m_i) is inf and inf / inf NaN",
                )
            return Verdict("written", True)
        errors = _row_errors(mine, expected)
        if errors.max() > TOLERANCE:
            where = _describe(case, number, len(cases))
            why = _misconception(criterion, case, number, errors)
            return Verdict(criterion, False, f"{where}: {_first_wrong_row(errors)}", why)
    return Verdict(criterion, True)


def _misconception(criterion: str, case: Case, number: int, errors: torch.Tensor) -> str:
    """What a failure of ``case`` most often means, from the difficulty it adds and the
    rows it got wrong (``errors``: ``_row_errors``); "" when nothing fits."""
    wrong = errors > TOLERANCE
    if criterion == "large_scores":  # a finite error is neither an overflow nor 0 / 0
        return LARGE_SCORES[case.scores] if errors[wrong].isinf().all() else ""
    if criterion != "kv_heads":
        return MISCONCEPTIONS[criterion]
    if not wrong.all():  # the same slots, read right for some heads
        return HEAD_MAPPING
    if number == 0:  # group 1: the heads' own KV heads, their slots in the wrong places
        return SLOT_STRIDE
    return ""


def _inputs(case: Case):
    from kvlab.env import default_device
    from kvlab.kernels.cases import random_query, shuffled_paged_cache

    device = default_device()
    kv_cache, block_table, lens = shuffled_paged_cache(
        case.seq_lens,
        case.block_size,
        case.num_kv_heads,
        case.head_dim,
        num_spare=2,
        extra_columns=1,
        unused_entry=-7,
        device=device,
        seed=len(case.seq_lens) + case.block_size,
    )
    if not case.shuffled:  # one sequence, its blocks in order: logical block i is physical i
        count = -(-case.seq_lens[0] // case.block_size)
        block_table[0, :count] = torch.arange(count)
    query = random_query(len(case.seq_lens), case.num_heads, case.head_dim, device=device)
    query = query * case.query_scale
    if case.scores != "random":
        query = _steer_scores(query, kv_cache, case.scores)
    return query, kv_cache, block_table, lens


def _steer_scores(query: torch.Tensor, kv_cache: torch.Tensor, sign: str) -> torch.Tensor:
    """Scores of about -300 for every slot (``"negative"``), or about +300 and -300 on
    alternate slots (``"mixed"``): every key gets 20 units along one direction (its sign
    alternating for "mixed", in place), and the query 15 * sqrt(head_dim) units against
    it. The random parts spread each row's scores by some tens."""
    head_dim = query.shape[-1]
    direction = torch.nn.functional.normalize(torch.ones(head_dim, device=query.device), dim=0)
    keys = kv_cache[0]  # (num_blocks, block_size, num_kv_heads, head_dim)
    signs = torch.ones(keys.shape[1], device=keys.device)
    if sign == "mixed":
        signs[1::2] = -1
    keys += 20 * signs[None, :, None, None] * direction
    return query - 15 * head_dim**0.5 * direction


def _row_errors(mine: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """(num_seqs, num_heads): each row's max |yours - reference|, inf where NaN."""
    error = (mine.float() - expected.float()).abs().amax(dim=-1)
    return torch.where(torch.isnan(error), torch.full_like(error, float("inf")), error)


def _first_wrong_row(error: torch.Tensor) -> str:
    """The row of ``_row_errors`` furthest off, and by how much."""
    seq, head = divmod(int(error.argmax()), error.shape[1])
    value = "NaN or inf" if error[seq, head].isinf() else f"{error[seq, head]:.2g}"
    return (
        f"sequence {seq}, query head {head} is off by {value} "
        f"(max |yours - reference|, allowed {TOLERANCE:g})"
    )


def _describe(case: Case, number: int, total: int) -> str:
    order = "shuffled" if case.shuffled else "in order"
    scores = {
        "random": f", queries x{case.query_scale:g}" if case.query_scale != 1.0 else "",
        "negative": ", every score near -300",
        "mixed": ", scores near +300 and -300 on alternate slots",
    }[case.scores]
    which = f"case {number + 1} of {total}: " if total > 1 else ""
    return (
        f"{which}seq_lens {case.seq_lens}, block_size {case.block_size} (blocks {order}), "
        f"{plural(case.num_heads, 'head')} / {plural(case.num_kv_heads, 'KV head')}, "
        f"head_dim {case.head_dim}{scores}"
    )


def check_generation(kernel, model=None) -> Verdict:
    """The tiny model, greedy, with the learner's kernel in every decode step's attention
    (prefill steps use kvlab's prefill kernel), against the reference backend."""
    from kvlab.attention import triton_attention
    from kvlab.cache.paged import PagedKVCache
    from kvlab.measure.serve import serve
    from kvlab.model.loading import load_model
    from kvlab.model.runner import ModelRunner

    if model is None:
        model, _ = load_model("tiny")

    def attention(query, layer, meta, cache, scale):
        if not meta.batch.is_decode:
            return triton_attention(query, layer, meta, cache, scale)
        kv = cache.kv_caches[layer]
        blocks = kv.view(2, -1, meta.block_size, *kv.shape[-2:])
        lens = meta.batch.seq_lens.to(device=query.device, dtype=torch.int32)
        return decode_with(kernel, query, blocks, meta.block_table, lens, scale)

    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, model.config.vocab_size, (n,), generator=gen).tolist() for n in (5, 19, 11)
    ]
    outputs = {}
    try:
        with one_torch_thread():
            for name, backend in (("yours", attention), ("reference", "reference")):
                runner = ModelRunner(model, attention=backend)
                cache = PagedKVCache.from_spec(runner.kv_spec(), num_blocks=32, block_size=4)
                outputs[name] = serve(runner, cache, prompts, max_new_tokens=8).outputs
    except Exception as error:  # noqa: BLE001 - the learner's kernel inside the model
        return engine_stopped(error)
    why = (
        "right on the random cases, wrong in the model: a size or stride typed in, or state "
        "left over from an earlier block"
    )
    what = "prompts {} decoded other tokens than the reference backend's"
    detail = (
        f"{len(prompts)} prompts, 7 decode steps each, every token as with the reference backend"
    )
    failure = different_requests(outputs["yours"], outputs["reference"], why, what)
    return failure or Verdict("generation", True, detail)
