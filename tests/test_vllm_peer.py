"""The vLLM comparison's plumbing, without vLLM: a clear message when its environment is
missing, and a driver that the side environment can run without kvlab.

The comparison itself (token identity with real vLLM) runs in CI after the test suite,
once ``make vllm-env`` has built the side environment (``.ci/run``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvlab.measure import vllm_peer


def test_a_missing_side_environment_names_the_command_that_builds_it(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    with pytest.raises(vllm_peer.VLLMUnavailable, match="make vllm-env"):
        vllm_peer.vllm_python()


def test_a_python_without_vllm_is_refused_with_the_same_hint(monkeypatch):
    import sys

    monkeypatch.setenv("KVLAB_VLLM_PYTHON", sys.executable)  # the labs' env has no vllm
    with pytest.raises(vllm_peer.VLLMUnavailable, match="cannot import vllm.*make vllm-env"):
        vllm_peer.vllm_python()


def test_without_vllm_the_command_says_so_and_exits_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("KVLAB_VLLM_PYTHON", str(tmp_path / "missing"))
    assert vllm_peer.main(["--num-requests", "2"]) == 2
    assert "make vllm-env" in capsys.readouterr().err


def test_the_driver_imports_nothing_from_kvlab():
    driver = Path(vllm_peer.__file__).with_name("vllm_driver.py")
    imported = set()
    for node in ast.walk(ast.parse(driver.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported <= {"json", "sys", "time", "vllm"}, imported


def test_the_table_puts_every_engine_against_vllm_as_it_configures_itself():
    rows = [
        vllm_peer.Row("kvlab", 2, [2.0, 1.0], [[1, 2], [3, 4]]),
        vllm_peer.Row("vLLM", 1, [2.0, 4.0], [[1, 2], [3, 4]]),
        vllm_peer.Row("hf-one-at-a-time", 2, [8.0], [[1, 2], [3, 5]]),
        vllm_peer.Row("vLLM on CPUs 0-1", None, [1.0], [[1, 2], [3, 4]]),
    ]
    lines = vllm_peer.format_rows(rows, num_tokens=4).splitlines()
    assert lines[1].split() == ["kvlab", "2", "4.0", "2", "2.00x", "2", "of", "2"]
    assert lines[2].split() == ["vLLM", "1", "2.0", "2", "1.00x", "2", "of", "2"]
    assert lines[3].split() == ["hf-one-at-a-time", "2", "0.5", "1", "0.25x", "1", "of", "2"]
    assert lines[4].split()[-7:] == ["?", "4.0", "1", "2.00x", "2", "of", "2"]


def test_the_matmul_floor_counts_weight_multiplies_and_nothing_else(tiny):
    import time

    import torch

    from kvlab.measure.matmul_floor import matmul_floor
    from kvlab.measure.workload import make_workload

    def elementwise_only() -> float:
        start = time.perf_counter()
        x = torch.randn(256, 256)
        for _ in range(20):
            x = torch.tanh(x) * 0.5 + x
        torch.bmm(x[None], x[None])  # attention-like batched products are not counted
        return time.perf_counter() - start

    assert matmul_floor(elementwise_only).matmul_seconds == 0
    workload = make_workload(3, tiny.config.vocab_size, 16, 4, seed=0)
    settings = dict(
        block_size=4, max_num_seqs=2, max_num_batched_tokens=16, enable_prefix_caching=False
    )
    floor = matmul_floor(lambda: vllm_peer.run_kvlab(tiny, workload, settings)[0])
    assert 0 < floor.matmul_seconds < floor.run_seconds
    assert 0 < floor.share < 1
