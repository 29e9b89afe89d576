"""Real vLLM from kvlab's process: find its side environment, run the driver there.

vLLM cannot share the labs' environment (it pins an older transformers and brings a server
stack), so ``make vllm-env`` builds ``.venv-vllm`` beside the repository (where CUDA exists,
point ``KVLAB_VLLM_PYTHON`` at your own vLLM's Python instead). ``run_vllm`` sends a
workload to ``vllm_driver.py`` in that environment as JSON and reads back its tokens,
timings and counters; ``vllm_python`` checks the environment first and says how to build
it when it is missing or broken. ``kvlab.measure.vllm_peer`` puts the result beside kvlab.

Not handled: a vLLM that is not importable as ``vllm`` (a server started elsewhere).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from kvlab.measure.workload import Workload
from kvlab.model.loading import smollm2_folder

SIDE_ENV = Path(__file__).resolve().parents[2] / ".venv-vllm"  # beside kvlab/, in the repo
BUILD_HINT = "build it with `make vllm-env` (from the repository root), or set KVLAB_VLLM_PYTHON"


class VLLMUnavailable(RuntimeError):
    """vLLM's side environment is missing or broken; the message says how to build it."""


def vllm_python() -> Path:
    """The Python of vLLM's side environment, checked to import vllm."""
    python = Path(os.environ.get("KVLAB_VLLM_PYTHON") or SIDE_ENV / "bin" / "python")
    if not python.exists():
        raise VLLMUnavailable(f"vLLM's side environment is missing ({python}): {BUILD_HINT}")
    probe = subprocess.run(
        [str(python), "-c", "import vllm"], capture_output=True, text=True, timeout=300
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise VLLMUnavailable(f"{python} cannot import vllm ({last}): {BUILD_HINT}")
    return python


def run_vllm(
    python: Path, workload: Workload, settings: dict, rounds: int, cores: str | None = None
) -> dict:
    """The workload on vLLM, in its own environment; its tokens, timings and counters.

    Args:
        cores: the CPUs vLLM computes on, as ``VLLM_CPU_OMP_THREADS_BIND`` takes them
            ("0-1"), with none kept for its scheduler process; None leaves vLLM's own
            choice (on a CPU it keeps one core per worker for that process).

    Returns:
        the driver's result, plus ``compute_cores``: the cores vLLM said it bound its
        compute threads to (None if its log did not say).
    """
    job = dict(
        settings,
        model=str(smollm2_folder()),
        prompts=workload.prompts,
        max_tokens=workload.output_lens,
        rounds=rounds,
    )
    env = dict(os.environ)
    if cores is not None:
        env.update(VLLM_CPU_OMP_THREADS_BIND=cores, VLLM_CPU_NUM_OF_RESERVED_CPU="0")
    driver = Path(__file__).with_name("vllm_driver.py")
    done = subprocess.run(
        [str(python), str(driver)], input=json.dumps(job), capture_output=True, text=True, env=env
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("KVLAB_RESULT ")]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"vLLM failed (exit {done.returncode}):\n{tail}")
    result = json.loads(lines[-1].removeprefix("KVLAB_RESULT "))
    bound = re.search(r"local_rank=0, core ids=\[([\d, ]*)\]", done.stdout + done.stderr)
    result["compute_cores"] = len(bound.group(1).split(",")) if bound else None
    return result
