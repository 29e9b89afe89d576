"""The seed article's servers at A100 scale: how many requests a second each one serves.

The seed article claims that paged KV management serves 10-24x the requests of a
"traditional" server; the PagedAttention paper measures request rates sustained at similar
latency against FasterTransformer and its reimplementation of Orca (its §6.2, Fig. 12).
Both are claims about GPUs. Here the servers replay one ShareGPT-like trace of Llama-2-7B
requests on a 40 GB A100, each step priced by the A100's roofline
(``kvlab.engine.step_cost.Roofline``: the weights and every running request's K/V read
once, or the step's arithmetic, whichever takes longer), so a step of 90 long requests
lasts longer than a step of 10:

    one at a time             one request runs, to its end, then the next: no batching
                              (the seed's "traditional" server)
    max-length, static        each request reserves max_model_len contiguous slots; a
                              batch runs until its longest request is done
                              (FasterTransformer's scheme)
    max-length, continuous    the same reservations; requests join and leave at every
                              step (Orca (Max))
    clairvoyant, continuous   each request reserves its true final length, which no real
                              server knows (Orca (Oracle))
    paged, continuous         blocks of 16 tokens taken as requests grow (vLLM)

    flat_out()               every request at once: each server as fast as it can go
    server_table(results)    throughput and latency of each server
    ratio_table(results)     paged's lead over each, beside the published ratios
    latency_sweep(rates)     each server at rising request rates (the paper's Fig. 12)
    sustained_rate(runs)     the highest rate whose normalized latency stays under a limit
    python -m kvlab.sim.servers   the flat-out tables

Not handled: prefix sharing, chunked prefill, swapping (the simulator's limits), traces of
an hour like the paper's (minutes here, for speed), latency limits other than the mean
normalized latency.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kvlab.engine.step_cost import Roofline
from kvlab.memory import preset
from kvlab.sim.metrics import SimResult
from kvlab.sim.simulator import simulate
from kvlab.sim.trace import make_trace

CLAIRVOYANT = "clairvoyant, continuous"
PAGED = "paged, continuous"
# The four servers the seed article and the paper compare; flat_out adds CLAIRVOYANT.
SERVERS = {
    "one at a time": dict(
        allocator="contiguous", reservation_policy="max_model_len", max_num_seqs=1
    ),
    "max-length, static": dict(
        allocator="contiguous", reservation_policy="max_model_len", batching="static"
    ),
    "max-length, continuous": dict(allocator="contiguous", reservation_policy="max_model_len"),
    PAGED: dict(allocator="paged", block_size=16),
}
_SETTINGS = {**SERVERS, CLAIRVOYANT: dict(allocator="contiguous", reservation_policy="exact")}
LATENCY_LIMIT = 0.1  # seconds per output token: about ten times an unloaded A100's

# What paged's lead over each server is, as published. The seed article's and vLLM's launch
# post's baseline is Hugging Face serving one request at a time; the PagedAttention paper's
# (Kwon et al., SOSP 2023, §6.2 and Fig. 12, OPT models on ShareGPT, one-hour traces) are
# request rates sustained at similar normalized latency against FasterTransformer (static
# batches sized for the longest request) and its Orca reimplementation, reserving the
# maximum length (Max) or each request's true length (Oracle).
PUBLISHED_RATIOS = {
    "one at a time": "10-24x seed; up to 24x HF, vLLM's launch post",
    "max-length, static": "up to 22x FasterTransformer, paper §6.2",
    "max-length, continuous": "2.7-8x Orca (Max), paper §6.2",
    CLAIRVOYANT: "1.7-2.7x Orca (Oracle), paper §6.2",
}


def flat_out(
    num_requests: int = 1000,
    seed: int = 0,
    spec: str = "llama-2-7b",
    gpu: str = "a100-40gb",
    servers: Sequence[str] = (*SERVERS, CLAIRVOYANT),
    equal_steps: float | None = None,
) -> dict[str, SimResult]:
    """Every request of one ShareGPT-like trace at once on each server, so each runs as
    fast as it can: server name -> its replay, in ``servers``' order with paged last.

    Each step is priced on ``gpu``'s roofline, unless ``equal_steps`` gives every step
    that many seconds, whatever it reads (the simulator's equal-step clock: what memory
    alone predicts).
    """
    order = [name for name in servers if name != PAGED] + [n for n in servers if n == PAGED]
    return _replay(num_requests, math.inf, order, seed, spec, gpu, equal_steps)


def _replay(num_requests, rate, servers, seed, spec, gpu, equal_steps=None) -> dict:
    """Each of ``servers`` on one trace of ``num_requests`` arriving at ``rate`` a second."""
    unknown = [name for name in servers if name not in _SETTINGS]
    if unknown:
        raise ValueError(f"servers={unknown!r} are not allowed: choose from {list(_SETTINGS)}")
    kv_spec = preset(spec)
    trace = make_trace(num_requests, "sharegpt", rate, seed, kv_spec.max_model_len)
    if equal_steps is None:
        clock = dict(step_cost=Roofline.of(kv_spec, gpu))
    else:
        clock = dict(step_seconds=equal_steps)
    return {name: simulate(trace, kv_spec, **clock, **_SETTINGS[name]) for name in servers}


def server_table(results: Mapping[str, SimResult]) -> str:
    """Throughput and latency of each server's replay: requests and output tokens per
    second, requests running at once (mean over steps), the mean step, time to first token
    and end to end (p50 / p99), and running requests preempted."""
    header = (
        f"{'server':<24}{'req/s':>6}{'tokens/s':>9}{'at once':>8}{'step ms':>8}"
        f"{'TTFT p50/p99 s':>16}{'E2E p50/p99 s':>15}{'preempted':>10}"
    )
    lines = [header, "-" * len(header)]
    for name, r in results.items():
        ttft = f"{r.ttft_p50:,.0f} / {r.ttft_p99:,.0f}"
        e2e = f"{r.e2e_p50:,.0f} / {r.e2e_p99:,.0f}"
        lines.append(
            f"{name:<24}{r.throughput:>6.2f}{r.tokens_per_s:>9,.0f}{r.mean_running:>8.1f}"
            f"{1000 * r.sim_seconds / r.num_steps:>8.1f}{ttft:>16}{e2e:>15}{r.num_preemptions:>10}"
        )
    return "\n".join(lines)


def ratio_table(results: Mapping[str, SimResult], paged: str = PAGED) -> str:
    """Paged's throughput over each other server's, beside the published ratio for the
    same kind of server (``PUBLISHED_RATIOS``)."""
    lines = [f"{'paged serves':<30}{'here':>7}  published"]
    for name, r in results.items():
        if name != paged:
            ratio = f"{results[paged].throughput / r.throughput:.1f}x"
            lines.append(f"{'vs ' + name:<30}{ratio:>7}  {PUBLISHED_RATIOS.get(name, '-')}")
    return "\n".join(lines)


def latency_sweep(
    rates: Sequence[float],
    duration_s: float = 240.0,
    servers: Sequence[str] = tuple(SERVERS),
    stop_after: float = 5 * LATENCY_LIMIT,
    seed: int = 0,
) -> dict[float, dict[str, SimResult]]:
    """Each server at each request rate, on a trace of ``duration_s`` seconds of arrivals
    (``rate x duration_s`` requests, at least 20): rate -> server -> replay.

    A fixed duration, as the paper's one-hour traces, makes a server that falls behind by
    a tenth fall behind by the same time, whatever its speed; a fixed number of requests
    would let a fast server drain its backlog sooner. A server is left out of the higher
    rates once its normalized latency passes ``stop_after`` (it only grows).
    """
    if not rates or min(rates) <= 0 or max(rates) == math.inf:
        raise ValueError(f"rates={list(rates)!r} is not allowed: give finite rates > 0")
    runs: dict[float, dict[str, SimResult]] = {}
    live = list(servers)
    for rate in sorted(rates):
        if not live:
            break
        num_requests = max(20, round(rate * duration_s))
        runs[rate] = _replay(num_requests, rate, live, seed, "llama-2-7b", "a100-40gb")
        live = [name for name in live if runs[rate][name].normalized_latency <= stop_after]
    return runs


def latency_curves(runs: Mapping[float, Mapping[str, SimResult]]) -> dict[str, list]:
    """``latency_sweep``'s runs as ``latency_figure`` draws them: server name ->
    ``(rate, normalized latency)`` at each rate it was replayed."""
    curves: dict[str, list[tuple[float, float]]] = {}
    for rate, by_name in sorted(runs.items()):
        for name, result in by_name.items():
            curves.setdefault(name, []).append((rate, result.normalized_latency))
    return curves


def sustained_rate(
    runs: Mapping[float, Mapping[str, SimResult]], name: str, limit: float = LATENCY_LIMIT
) -> float | None:
    """The highest rate of ``latency_sweep``'s runs at which ``name``'s normalized latency
    is at most ``limit`` (None if it is above it at every rate replayed)."""
    held = [rate for rate, by_name in runs.items() if name in by_name]
    held = [rate for rate in held if runs[rate][name].normalized_latency <= limit]
    return max(held) if held else None


def main(num_requests: int = 1000) -> None:
    results = flat_out(num_requests)
    print(
        f"{num_requests} ShareGPT-like requests, all at once, Llama-2-7B on an A100-40GB; each "
        "step priced by the A100's roofline (kvlab.engine.step_cost.Roofline)\n"
    )
    print(server_table(results), end="\n\n")
    print(ratio_table(results))


if __name__ == "__main__":
    main()
