"""Lab 05's build-it exercise: the grader passes a right one-pass decode kernel, gives the
untouched stub nothing, and catches each planted defect with the criterion meant for it.

The right kernel is ``tests/solutions/lab05_kernel.py``, the lab's cell with its loop
written as a learner would. The stub and each planted defect are that file with a few
lines changed, written to a module of their own (Triton reads a kernel's source from its
file).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import kvlab  # noqa: F401 (before triton: kvlab chooses how Triton runs)
from kvlab.exercises.build_kernel import (
    CRITERIA,
    HEAD_MAPPING,
    LARGE_SCORES,
    MISCONCEPTIONS,
    SLOT_STRIDE,
    check_generation,
    check_kernel,
    hint_kernel,
    reveal_kernel,
)

pytestmark = pytest.mark.usefixtures("one_thread")

SOLUTION = Path(__file__).parent / "solutions" / "lab05_kernel.py"
LOOP_START = "        block = tl.load("
LOOP_END = "        m_i = m_new\n"

SCORES = 'tl.where(in_seq, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))'
# name: ((old, new) replacements in the solution, the criterion that must catch it, the
# misconception the check must name)
PLANTED = {
    "no_scale": (
        [("axis=1) * scale, float", "axis=1), float")],
        "one_block",
        MISCONCEPTIONS["one_block"],
    ),
    # A slot stride typed as HEAD_DIM: right for one KV head, wrong for every head of two.
    "slot_stride_head_dim": (
        [("slots[:, None] * stride_kv_slot", "slots[:, None] * HEAD_DIM")],
        "kv_heads",
        SLOT_STRIDE,
    ),
    # Query heads spread over the KV heads (0, 1, 0, 1) instead of grouped (0, 0, 1, 1).
    "gqa_head_modulo": (
        [("(head // GROUP) * stride_kv_head", "(head % GROUP) * stride_kv_head")],
        "kv_heads",
        HEAD_MAPPING,
    ),
    # Query head h read from KV head h: right without GQA only.
    "gqa_no_group": (
        [("(head // GROUP) * stride_kv_head", "head * stride_kv_head")],
        "kv_heads",
        HEAD_MAPPING,
    ),
    "no_rescale": (
        [("l_i = l_i * alpha +", "l_i = l_i +"), ("acc = acc * alpha +", "acc = acc +")],
        "online_softmax",
        MISCONCEPTIONS["online_softmax"],
    ),
    "ignores_block_table": (
        [
            (
                "block = tl.load(block_table_ptr + seq * stride_bt_seq + logical).to(tl.int64)",
                "block = logical",
            )
        ],
        "block_table",
        MISCONCEPTIONS["block_table"],
    ),
    "no_mask": (
        [
            ("mask=in_seq[:, None], other=0.0", "mask=None"),
            (SCORES, "tl.sum(k * q[None, :], axis=1) * scale"),
        ],
        "partial_block",
        MISCONCEPTIONS["partial_block"],
    ),
    "masked_scores_zero": (
        [(SCORES, "tl.sum(k * q[None, :], axis=1) * scale")],
        "partial_block",
        MISCONCEPTIONS["partial_block"],
    ),
    # A running max that starts at 0: right while some score of a row is above 0, 0 / 0
    # when every score is near -300.
    "max_starts_at_zero": (
        [
            (
                'm_i = tl.full([], float("-inf"), dtype=tl.float32)',
                "m_i = tl.zeros([], dtype=tl.float32)",
            )
        ],
        "large_scores",
        LARGE_SCORES["negative"],
    ),
    # The max taken over the raw scores, the masked slots' 0 among them: the same.
    "max_before_masking": (
        [
            (
                "m_new = tl.maximum(m_i, tl.max(scores, axis=0))",
                "m_new = tl.maximum(m_i, tl.max(tl.sum(k * q[None, :], axis=1) * scale, axis=0))",
            )
        ],
        "large_scores",
        LARGE_SCORES["negative"],
    ),
    "raw_exp": (
        [
            ("alpha = tl.exp(m_i - m_new)", "alpha = 1.0"),
            ("p = tl.exp(scores - m_new)", "p = tl.exp(scores)"),
        ],
        "large_scores",
        LARGE_SCORES["random"],
    ),
    # Scores clipped at -100 "against underflow": the slots past seq_len, clipped too, count
    # as much as the real ones once every score is near -300. The error is finite, neither
    # the 0 / 0 of a max that starts at 0 nor an overflow: no misconception fits.
    "scores_clipped_below": (
        [(SCORES, f"tl.maximum({SCORES}, -100.0)")],
        "large_scores",
        "",
    ),
    # Scores clipped at 100 "against overflow": wrong by a finite amount once scores are in
    # the hundreds, not the inf / inf of exp(score) without the max: none named.
    "scores_clipped_above": (
        [(SCORES, f"tl.minimum({SCORES}, 100.0)")],
        "large_scores",
        "",
    ),
    # BLOCK_SIZE typed as the 8 of every case before "shapes".
    "block_size_typed": (
        [("in_seq = logical * BLOCK_SIZE + slots", "in_seq = logical * 8 + slots")],
        "shapes",
        MISCONCEPTIONS["shapes"],
    ),
}


def kernel_from(path: Path, replacements, tmp_path: Path, name: str):
    source = path.read_text()
    for old, new in replacements:
        assert old in source, old
        source = source.replace(old, new)
    module_path = tmp_path / f"kernel_{name}.py"
    module_path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"kernel_{name}", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.my_decode_kernel


def stub(tmp_path):
    source = SOLUTION.read_text()
    start, end = source.index(LOOP_START), source.index(LOOP_END) + len(LOOP_END)
    body = "        pass  # your code\n"
    return kernel_from(SOLUTION, [(source[start:end], body)], tmp_path, "stub")


def test_the_stub_scores_nothing(tmp_path):
    report = check_kernel(stub(tmp_path))
    assert report.score == 0 and len(report.verdicts) == 1
    assert "not written yet" in report.verdicts[0].detail


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_each_planted_defect_fails_its_criterion_named(name, tmp_path):
    replacements, criterion, misconception = PLANTED[name]
    report = check_kernel(kernel_from(SOLUTION, replacements, tmp_path, name))
    failed = report.verdicts[-1]
    assert not failed.passed and failed.criterion == criterion, report
    assert "sequence" in failed.detail and failed.misconception == misconception, report
    assert all(v.passed for v in report.verdicts[:-1])


def test_a_loop_that_makes_nan_is_told_apart_from_an_empty_one(tmp_path):
    kernel = kernel_from(
        SOLUTION, [("p = tl.exp(scores - m_new)", "p = tl.exp(scores - m_i)")], tmp_path, "old_max"
    )
    verdict = check_kernel(kernel).verdicts[0]
    assert not verdict.passed and "or it makes NaN" in verdict.detail
    assert "scores - m_new" in verdict.misconception


def test_the_right_kernel_passes_every_criterion(tmp_path):
    report = check_kernel(kernel_from(SOLUTION, [], tmp_path, "right"))
    assert report.passed, report


def test_a_kernel_that_raises_gets_its_error(tmp_path):
    kernel = kernel_from(
        SOLUTION, [("in_seq = logical", "in_seq = undefined_name + logical")], tmp_path, "raises"
    )
    verdict = check_kernel(kernel).verdicts[0]
    assert not verdict.passed and "raised" in verdict.detail and "undefined_name" in verdict.detail


def test_generation_catches_a_kernel_wrong_in_the_model(tmp_path):
    kernel = kernel_from(SOLUTION, PLANTED["ignores_block_table"][0], tmp_path, "gen")
    assert not check_generation(kernel).passed


def test_help_comes_in_steps():
    assert [hint_kernel(level)[:7] for level in (1, 2, 3)] == ["Section", "Scores ", "Inside "]
    # The last hint is numbered steps, shown as lines in a notebook (not a quoted string).
    steps = hint_kernel(3)
    assert repr(steps) == str(steps) and "\n  9. m_i = m_new" in steps
    with pytest.raises(ValueError, match="level=0 is not allowed"):
        hint_kernel(0)
    assert "def _paged_decode_kernel" in reveal_kernel()
    assert list(CRITERIA)[0] == "written" and list(CRITERIA)[-1] == "generation"
