"""Build it (lab 05): the one-pass decode kernel's inner loop, in Triton, checked.

The learner completes ``my_decode_kernel`` in lab 05: the program of the two-pass kernel
of section 3 (one query head of one sequence), with its loop over the sequence's logical
blocks left empty. One pass of the loop, written by the learner:

    block  = block_table[seq, logical]            the gather: where this block lives
    k, v   = its keys and values, masked past seq_len
    scores = q . k * scale                        (-inf past seq_len)
    m_new  = max(m_i, max(scores));  alpha = exp(m_i - m_new);  p = exp(scores - m_new)
    l_i    = l_i * alpha + sum(p);   acc = acc * alpha + p @ v;  m_i = m_new

``check_kernel(my_decode_kernel)`` launches it (``decode_with``: one program per (sequence,
query head), in the interpreter on a CPU) on cases that each add one difficulty, and
compares every output row with ``paged_decode_attention_ref``; it stops at the first
case that fails and names the row, the error and the misconception it most often means.
When every case holds, the tiny model generates with the learner's kernel computing the
attention of every decode step, and its tokens must equal the reference backend's.

    hint_kernel(1), (2), (3)   help in steps
    reveal_kernel()            kvlab's own kernel (``kvlab.kernels.paged_attention``)

Not handled: head_dim or block_size that are not powers of two (``tl.arange`` needs them),
split-K, float16.
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import torch

from kvlab.exercises.grading import Hint, Report, Verdict, engine_stopped, hint, one_torch_thread

__all__ = ["CRITERIA", "check_kernel", "decode_with", "hint_kernel", "reveal_kernel"]

CRITERIA = {
    "written": "the loop computes something (the output is no longer 0 / 0)",
    "one_block": "one full block: softmax(q . k * scale) @ v over its slots",
    "online_softmax": "several blocks in order: l_i and acc rescaled by alpha as the max grows",
    "block_table": "blocks scattered over the pool: each read where the block table says",
    "partial_block": "contexts that end mid-block: the slots past seq_len count for nothing",
    "large_scores": "scores in the hundreds, of either sign: exp(score - running max)",
    "shapes": "block sizes 1 to 32, GQA groups 1 to 4, head_dim 16 to 64, up to 4 sequences",
    "generation": "the tiny model decodes through your kernel the reference backend's tokens",
}
STUCK = "Stuck? hint_kernel(1), then 2 and 3; print(reveal_kernel()) shows kvlab's own kernel."
TOLERANCE = 1e-5  # float32: the order of the sums changes only the last bits

# criterion: (seq_lens, block_size, num_heads, num_kv_heads, head_dim, shuffled, query scale,
#             and optionally the scores' sign: "negative" or "mixed", see _steer_scores)
CASES = {
    "one_block": [([8], 8, 1, 1, 16, False, 1.0)],
    # One sequence each: in order, its logical block i is physical block i.
    "online_softmax": [([16], 4, 2, 2, 16, False, 3.0), ([40], 8, 1, 1, 32, False, 3.0)],
    "block_table": [([16, 12, 8], 4, 2, 2, 16, True, 1.0)],
    "partial_block": [([10, 7, 13], 4, 2, 2, 16, True, 1.0), ([1, 5], 8, 1, 1, 16, True, 1.0)],
    "large_scores": [
        ([12, 9], 4, 2, 2, 16, True, 100.0),
        # Every score of a row near -300: a running max that starts at 0, or that takes
        # the max before the slots past seq_len are masked, leaves exp(-300) = 0 for every
        # slot, and 0 / 0.
        ([12, 9], 4, 2, 2, 16, True, 1.0, "negative"),
        ([13, 6], 4, 2, 1, 16, True, 1.0, "mixed"),
    ],
    "shapes": [
        ([9, 4], 1, 2, 2, 16, True, 1.0),
        ([37, 10, 3], 8, 4, 1, 32, True, 1.0),
        ([50, 17], 16, 4, 2, 64, True, 1.0),
        ([5, 11, 2, 8], 2, 3, 1, 16, True, 1.0),
        ([70, 33], 32, 2, 1, 64, True, 1.0),
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
    "large_scores": "exponentiate scores minus the running max, never the raw scores "
    "(exp(100) is past float32's range); the max starts at -inf, not 0, and is taken after "
    "the slots past seq_len are set to -inf (else a row whose scores are all near -300 "
    "underflows to 0 / 0)",
    "shapes": "use the strides and constexprs the kernel is given (stride_kv_slot, "
    "stride_bt_seq, HEAD_DIM, BLOCK_SIZE): no size typed in",
}
HINTS = (
    "Section 3.2's kernel has everything one block needs: the block-table load, in_seq, the "
    "offsets, the masked loads of k and v, the scores. Copy that into the loop, then replace "
    "its two passes by section 5's five lines: m_new, alpha, p, l_i, acc.",
    "Scores past seq_len must be -inf before the max: scores = tl.where(in_seq, "
    "tl.sum(k * q[None, :], axis=1) * scale, float('-inf')). m_new = tl.maximum(m_i, "
    "tl.max(scores, axis=0)); alpha = tl.exp(m_i - m_new); p = tl.exp(scores - m_new). "
    "On the first block m_i is -inf and alpha is 0: nothing to rescale yet.",
    "block = tl.load(block_table_ptr + seq * stride_bt_seq + logical).to(tl.int64); in_seq = "
    "logical * BLOCK_SIZE + slots < seq_len; offsets = block * stride_kv_block + slots[:, "
    "None] * stride_kv_slot + dims[None, :]; k = tl.load(k_head_ptr + offsets, mask=in_seq[:, "
    "None], other=0.0).to(tl.float32); v = tl.load(v_head_ptr + offsets, mask=in_seq[:, "
    "None], other=0.0).to(tl.float32); scores, m_new, alpha, p as in hint 2; l_i = l_i * "
    "alpha + tl.sum(p, axis=0); acc = acc * alpha + tl.sum(p[:, None] * v, axis=0); "
    "m_i = m_new.",
)


def decode_with(kernel, query, kv_cache, block_table, seq_lens, scale=None) -> torch.Tensor:
    """Launch a learner's decode kernel: one program per (sequence, query head).

    The kernel has the arguments of lab 05's ``naive_paged_decode_kernel``.
    """
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


def check_kernel(kernel, model=None) -> Report:
    """Grade a learner's decode kernel, criterion by criterion, then in the tiny model."""
    verdicts = []
    for criterion, cases in (("written", CASES["one_block"]), *CASES.items()):
        verdict = _check_cases(kernel, criterion, cases)
        verdicts.append(verdict)
        if not verdict.passed:
            return Report(verdicts, CRITERIA, STUCK)
    verdicts.append(check_generation(kernel, model))
    return Report(verdicts, CRITERIA, STUCK)


def _check_cases(kernel, criterion: str, cases: list[tuple]) -> Verdict:
    from kvlab.kernels import paged_decode_attention_ref

    for number, case in enumerate(cases):
        query, kv_cache, block_table, seq_lens = _inputs(*case)
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
        failure = _first_wrong_row(mine, expected)
        if failure is not None:
            where = _describe(case, number, len(cases))
            return Verdict(criterion, False, f"{where}: {failure}", MISCONCEPTIONS[criterion])
    return Verdict(criterion, True)


def _inputs(
    seq_lens, block_size, num_heads, num_kv_heads, head_dim, shuffled, query_scale, sign=None
):
    from kvlab.env import default_device
    from kvlab.kernels.cases import random_query, shuffled_paged_cache

    device = default_device()
    kv_cache, block_table, lens = shuffled_paged_cache(
        seq_lens,
        block_size,
        num_kv_heads,
        head_dim,
        num_spare=2 if shuffled else 0,
        extra_columns=1,
        unused_entry=-7,
        device=device,
        seed=len(seq_lens) + block_size,
    )
    if not shuffled:  # one sequence, its blocks in order: logical block i is physical i
        count = -(-seq_lens[0] // block_size)
        block_table[0, :count] = torch.arange(count)
    query = random_query(len(seq_lens), num_heads, head_dim, device=device) * query_scale
    if sign is not None:
        query = _steer_scores(query, kv_cache, sign)
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


def _first_wrong_row(mine: torch.Tensor, expected: torch.Tensor) -> str | None:
    error = (mine.float() - expected.float()).abs().amax(dim=-1)  # (num_seqs, num_heads)
    error = torch.where(torch.isnan(error), torch.full_like(error, float("inf")), error)
    if error.max() <= TOLERANCE:
        return None
    seq, head = divmod(int(error.argmax()), error.shape[1])
    value = "NaN or inf" if error[seq, head].isinf() else f"{error[seq, head]:.2g}"
    return (
        f"sequence {seq}, query head {head} is off by {value} "
        f"(max |yours - reference|, allowed {TOLERANCE:g})"
    )


def _describe(case: tuple, number: int, total: int) -> str:
    seq_lens, block_size, num_heads, num_kv_heads, head_dim, shuffled, query_scale = case[:7]
    order = "shuffled" if shuffled else "in order"
    scores = f", queries x{query_scale:g}" if query_scale != 1.0 else ""
    if case[7:] == ("negative",):
        scores = ", every score near -300"
    elif case[7:] == ("mixed",):
        scores = ", scores near +300 and -300 on alternate slots"
    which = f"case {number + 1} of {total}: " if total > 1 else ""
    return (
        f"{which}seq_lens {seq_lens}, block_size {block_size} (blocks {order}), "
        f"{num_heads} heads / {num_kv_heads} KV heads, head_dim {head_dim}{scores}"
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
    if outputs["yours"] != outputs["reference"]:
        bad = [
            i
            for i, (a, b) in enumerate(zip(outputs["yours"], outputs["reference"], strict=True))
            if a != b
        ]
        return Verdict(
            "generation",
            False,
            f"prompts {bad} decoded other tokens than the reference backend's",
            "right on the random cases, wrong in the model: a size or stride typed in, or "
            "state left over from an earlier block",
        )
    return Verdict(
        "generation",
        True,
        f"{len(prompts)} prompts, 7 decode steps each, every token as with the reference backend",
    )


def hint_kernel(level: int = 1) -> Hint:
    """Help in steps: 1 where to start, 2 the masked online softmax, 3 the whole loop."""
    return hint(HINTS, level)


def reveal_kernel() -> str:
    """kvlab's own decode kernel: tiles of TILE_N tokens, GQA groups, split-K."""
    from kvlab.kernels import paged_attention

    return inspect.getsource(paged_attention._paged_decode_kernel.fn)
