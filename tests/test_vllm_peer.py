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
