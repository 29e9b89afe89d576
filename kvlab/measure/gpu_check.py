"""One prepared check of kvlab's CUDA paths: ``python -m kvlab.measure.gpu_check``

A GPU comes to kvlab's developers rarely and for minutes, so what runs on one must be
ready in one command, run in about eight minutes on an H200, and leave a report. In order:

    kernels   the kernels' own tests (tests/test_kernels.py, test_kernel_steps.py), compiled:
              every dtype, block size, GQA ratio and head_dim the interpreter checks
    bench     paged decode's achieved bandwidth (KV bytes read / time) against the
              device's peak, beside the torch reference and SDPA on a contiguous cache
              (``kvlab.kernels.bench``): batch 1, 16, 64 and 256 at 4k tokens of context,
              block sizes 16 and 32, split-K at batch 1 to 4
    engine    kvlab (SDPA and Triton backends) against transformers' ``generate``, token
              for token, on the tiny models and on SmolLM2's shape with seeded random
              weights: identical in float32, the share of requests identical in
              bfloat16; tokens/s against ``generate_batch``
    swap      a run preempted by swapping (pinned host blocks, the side-stream prefetch)
              against the same run with room for everyone, token for token; the memory
              gauge's CUDA figures beside ``torch.cuda.memory_allocated``

Without CUDA every part runs on the CPU at small sizes (Triton in its interpreter, no
timings that mean anything), so the test suite proves the check itself works
(``tests/test_gpu_check.py``). A part that fails is reported and the next one runs; the
exit status is 1 when any failed. The report is printed and written to ``--out``.

On a GPU machine with no downloads (kvlab's test machines), from the repository:
``pip install --no-deps --no-build-isolation -e . && python -m kvlab.measure.gpu_check``.

Not handled: more than one GPU, CUDA graphs, vLLM on the GPU.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
KERNEL_TESTS = ("tests/test_kernels.py", "tests/test_kernel_steps.py")
BANDWIDTH_TARGET = 0.80  # of the device's peak, paged decode at 64 sequences x 4k tokens


@dataclass
class Part:
    """One part of the check: whether it held, and what it saw."""

    name: str
    passed: bool = True
    lines: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def note(self, line: str) -> None:
        self.lines.append(line)

    def fail(self, line: str) -> None:
        self.passed = False
        self.lines.append(f"FAILED: {line}")

    def __str__(self) -> str:
        verdict = "ok" if self.passed else "FAILED"
        head = f"== {self.name}: {verdict} ({self.seconds:.0f} s)"
        return "\n".join([head, *(f"   {line}" for line in self.lines)])


def run_part(name: str, body: Callable[[Part], None]) -> Part:
    """``body(part)``, timed; an exception fails the part with its last lines."""
    part = Part(name)
    start = time.perf_counter()
    try:
        body(part)
    except Exception as error:  # noqa: BLE001 - a part that breaks is a finding, not the end
        tail = traceback.format_exc().strip().splitlines()[-3:]
        part.fail(f"{type(error).__name__}: {error}")
        part.lines += [f"  {line}" for line in tail[:-1]]
    part.seconds = time.perf_counter() - start
    return part


# ---- kernels -------------------------------------------------------------------------------


def check_kernels(part: Part, on_cuda: bool) -> None:
    """The kernels' test files under pytest: all of them on CUDA; on a CPU one case (the
    test suite runs the rest in the interpreter)."""
    files = [f for f in KERNEL_TESTS if (REPO / f).exists()]
    if not files:
        part.note("skipped: no tests/ beside kvlab (run from a repository checkout)")
        return
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    command += files if on_cuda else [files[0], "-k", "split_k_equals_no_split"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200)
    summary = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    part.note(f"pytest {' '.join(command[command.index('addopts=') + 1 :])}: {summary}")
    if done.returncode != 0:
        failures = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
        part.lines += failures[:20]
        part.fail(f"pytest exited with {done.returncode}: {done.stderr.strip()[-300:]}")


# ---- bench ---------------------------------------------------------------------------------


def check_bench(part: Part, on_cuda: bool) -> None:
    """Achieved bandwidth on CUDA, against the target at 64 x 4k; on a CPU the kernel
    against the reference, split and not."""
    from kvlab.kernels import bench

    if not on_cuda:
        for num_splits, error in bench.cpu_errors():
            line = f"interpreter, num_splits={num_splits}: max |kernel - reference| {error:.1e}"
            (part.note if error < 1e-4 else part.fail)(line)
        return
    cases = [bench.Case(64, 4096), bench.Case(64, 4096, block_size=32)]
    cases += [bench.Case(n, 4096) for n in (1, 2, 3, 4, 16, 256)]
    name = torch.cuda.get_device_name()
    peak = bench.peak_bandwidth_gbps(name)
    part.note(f"{name}: peak {peak or 'unknown'} GB/s (data sheet)")
    headline = None
    for case in cases:
        part.note(bench.describe(case))
        for row in bench.measure(case, peak):
            part.note(f"  {row}")
            if case == cases[0] and row.label == "triton paged":
                headline = row.share
            if row.error > bench.tolerance(case.dtype):
                part.fail(f"{row.label} differs from SDPA by {row.error:.1e}")
    if headline is None:
        part.note("peak unknown: no share of peak to check")
    elif headline < BANDWIDTH_TARGET:
        part.fail(f"triton paged at 64 x 4k: {headline:.0%} of peak, target {BANDWIDTH_TARGET:.0%}")
    else:
        part.note(
            f"triton paged at 64 x 4k: {headline:.0%} of peak (target {BANDWIDTH_TARGET:.0%})"
        )


# ---- engine --------------------------------------------------------------------------------


def smollm2_shaped(num_layers: int | None = None, seed: int = 0):
    """A Llama with SmolLM2-135M's shape (``num_layers`` of its 30) and seeded random
    weights: the real model's work without its wheel, which a GPU machine may lack."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=num_layers or 30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return LlamaForCausalLM(config).eval()
    finally:
        torch.random.set_rng_state(state)


def check_engine(part: Part, device: torch.device, on_cuda: bool) -> None:
    """kvlab's tokens against ``generate``'s, per model, backend and dtype; then speed."""
    from kvlab.model.loading import load_model

    models = {name: load_model(name, device="cpu")[0] for name in ("tiny", "tiny-qwen2")}
    models["smollm2-shaped"] = smollm2_shaped(None if on_cuda else 2)
    num_requests, max_tokens = (16, 32) if on_cuda else (3, 6)
    dtypes = (torch.float32, torch.bfloat16) if on_cuda else (torch.float32,)
    for name, model in models.items():
        for dtype in dtypes:
            model = model.to(device=device, dtype=dtype)
            workload = _workload(model, num_requests, max_tokens, 128 if on_cuda else 16)
            expected = _hf_tokens(model, workload)
            for backend in ("sdpa", "triton"):
                got = _kvlab_tokens(model, workload, backend)
                same = sum(a == b for a, b in zip(got, expected, strict=True))
                line = (
                    f"{name}, {str(dtype).removeprefix('torch.')}, {backend}: {same} of "
                    f"{len(got)} requests identical to generate"
                )
                if dtype == torch.float32 and same < len(got):
                    part.fail(line)
                else:
                    part.note(line)
    _throughput(part, models["smollm2-shaped" if on_cuda else "tiny"].float(), on_cuda)


def _workload(model, num_requests: int, max_tokens: int, max_prompt_len: int = 128):
    from kvlab.measure.workload import make_workload

    vocab_size = model.config.vocab_size
    return make_workload(num_requests, vocab_size, max_prompt_len, max_tokens, seed=1)


def _hf_tokens(model, workload) -> list[list[int]]:
    from kvlab.measure.hf_baselines import run_hf_one_at_a_time

    return run_hf_one_at_a_time(model, workload).outputs


def _kvlab_tokens(model, workload, backend: str, **settings) -> list[list[int]]:
    from kvlab.engine.llm import LLM
    from kvlab.measure.bench import timed_generate

    llm = LLM(model, attention_backend=backend, block_size=16, num_blocks=256, **settings)
    return timed_generate(llm, workload)[1]


def _throughput(part: Part, model, on_cuda: bool) -> None:
    """kvlab continuous against ``generate_batch`` with the same blocks, seats and budget."""
    from kvlab.engine.llm import LLM
    from kvlab.measure.bench import timed_generate
    from kvlab.measure.hf_baselines import run_hf_generate_batch

    workload = _workload(model, 64 if on_cuda else 4, 64 if on_cuda else 4, 128 if on_cuda else 16)
    limits = dict(num_blocks=1024, block_size=16, max_num_seqs=32, max_num_batched_tokens=2048)
    llm = LLM(model, attention_backend="triton" if on_cuda else "sdpa", **limits)
    timed_generate(llm, workload)  # the first run compiles and warms up
    seconds, ours = timed_generate(llm, workload)
    try:
        hf = run_hf_generate_batch(model, workload, **limits)
    except ImportError as error:
        part.note(f"generate_batch not in this transformers: {error}")
        return
    if not any(hf.outputs):  # seen with transformers 5.17 on a CPU: no batch processor ran
        part.note("generate_batch returned no tokens here: no speed comparison")
        return
    tokens = workload.num_output_tokens
    part.note(
        f"{len(workload.prompts)} requests, {tokens} tokens: kvlab {tokens / seconds:.0f} "
        f"tokens/s, generate_batch {tokens / hf.seconds:.0f} ({hf.seconds / seconds:.2f}x)"
    )
    if ours != hf.outputs:
        part.fail("kvlab's tokens differ from generate_batch's")


# ---- swap ----------------------------------------------------------------------------------


def check_swap(part: Part, device: torch.device, on_cuda: bool) -> None:
    """A run preempted by swapping against one with room for everyone, token for token."""
    from kvlab.engine.llm import LLM
    from kvlab.measure.bench import timed_generate
    from kvlab.model.loading import load_model

    model = load_model("tiny", device=device)[0]
    # Eight requests of up to 40 tokens (10 blocks) each in a pool of 16 blocks.
    workload = _workload(model, 8, 20, max_prompt_len=20)
    expected = timed_generate(LLM(model, num_blocks=256, block_size=4, max_num_seqs=8), workload)
    tight = LLM(
        model, num_blocks=16, block_size=4, max_num_seqs=8, preemption_mode="swap", prefetch=True
    )
    _, got = timed_generate(tight, workload)
    metrics, swap = tight.metrics, tight.engine.swap_space
    part.note(
        f"{metrics.num_preemptions} preemptions, {metrics.num_swap_outs} swapped out, "
        f"{metrics.num_swap_ins} back in, {metrics.num_prefetched} prefetched"
    )
    if got != expected[1]:
        part.fail("a swapped run's tokens differ from the run with room for everyone")
    if metrics.num_swap_outs == 0:
        part.fail("nothing was swapped out: the pool was not tight enough")
    if on_cuda:
        pinned = all(t.is_pinned() for t in swap.cpu_kv)
        (part.note if pinned else part.fail)(f"host blocks pinned: {pinned}")
        _memory(part, tight)


def _memory(part: Part, llm) -> None:
    """The gauge's CUDA figures (``CudaMemory``) beside PyTorch's own counters."""
    try:
        from kvlab.widgets.memory_gauge import CudaMemory
    except ImportError as error:  # the widgets need anywidget, which a GPU box may lack
        part.note(f"memory gauge not importable here: {error}")
        return
    seen = CudaMemory.read(llm.engine.cache.device)
    allocated = torch.cuda.memory_allocated(llm.engine.cache.device)
    line = (
        f"gauge: allocated {seen.allocated_bytes:,} B; torch.cuda.memory_allocated {allocated:,} B"
    )
    (part.note if seen.allocated_bytes == allocated else part.fail)(line)


# ---- the whole check -----------------------------------------------------------------------


def run_check(parts: tuple[str, ...] = ("kernels", "bench", "engine", "swap")) -> list[Part]:
    """Run the named parts in order; each one's report."""
    from kvlab.env import default_device, env_report

    device = default_device()
    on_cuda = device.type == "cuda"
    bodies = {
        "kernels": lambda p: check_kernels(p, on_cuda),
        "bench": lambda p: check_bench(p, on_cuda),
        "engine": lambda p: check_engine(p, device, on_cuda),
        "swap": lambda p: check_swap(p, device, on_cuda),
    }
    unknown = [p for p in parts if p not in bodies]
    if unknown:
        raise ValueError(f"parts={unknown!r} are not allowed: choose from {sorted(bodies)}")
    environment = Part("environment", lines=str(env_report()).splitlines())
    return [environment, *(run_part(name, bodies[name]) for name in parts)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check.txt"), help="report file")
    parser.add_argument("--parts", nargs="+", default=["kernels", "bench", "engine", "swap"])
    args = parser.parse_args(argv)
    start = time.perf_counter()
    with redirect_stdout(io.StringIO()):  # kvlab's and transformers' own chatter
        parts = run_check(tuple(args.parts))
    passed = all(p.passed for p in parts)
    lines = [str(p) for p in parts]
    lines.append(
        f"{'all parts held' if passed else 'SOME PARTS FAILED'} in "
        f"{time.perf_counter() - start:.0f} s ({time.strftime('%Y-%m-%d %H:%M')})"
    )
    report = "\n".join(lines)
    print(report)
    args.out.write_text(report + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
