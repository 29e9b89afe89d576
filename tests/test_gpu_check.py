"""The prepared GPU check runs end to end here, on the CPU: every part, small sizes.

A GPU is lent to kvlab's developers for minutes at a time; the check must not be what
breaks then. So CI runs it whole on the CPU (Triton in its interpreter), and a part that
raises must be reported without stopping the others.
"""

from __future__ import annotations

import pytest

from kvlab.measure import gpu_check

pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_part_holds_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "report.txt"
    assert gpu_check.main(["--out", str(out)]) == 0
    report = out.read_text()
    assert report == capsys.readouterr().out
    for part in ("environment", "kernels", "bench", "engine", "swap"):
        assert f"== {part}: ok" in report, report
    assert "smollm2-shaped, float32, triton: 3 of 3 requests identical to generate" in report
    assert "swapped out" in report and report.rstrip().splitlines()[-1].startswith("all parts")


def test_a_part_that_breaks_is_reported_and_the_next_one_runs(monkeypatch, tmp_path):
    def broken(part, on_cuda):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(gpu_check, "check_bench", broken)
    out = tmp_path / "report.txt"
    assert gpu_check.main(["--out", str(out), "--parts", "bench", "swap"]) == 1
    report = out.read_text()
    assert "== bench: FAILED" in report and "RuntimeError: no such kernel" in report
    assert "== swap: ok" in report and "SOME PARTS FAILED" in report


def test_an_unknown_part_is_refused():
    with pytest.raises(ValueError, match=r"parts=\['gpu'\] are not allowed: choose from"):
        gpu_check.run_check(("gpu",))
