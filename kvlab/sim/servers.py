"""The seed article's servers at A100 scale: how many requests a second each one sustains.

The seed article claims that paged KV management serves 10-24x the requests of a
"traditional" server; the PagedAttention paper measures 2-4x over Orca and up to 22x over
FasterTransformer (its §6.2, Fig. 12). Both are claims about GPUs. Here four servers replay
the same ShareGPT-like trace of Llama-2-7B requests on a 40 GB A100, each step priced by
the A100's roofline (``kvlab.engine.step_cost.Roofline``: the weights and every running
request's K/V read once, or the step's arithmetic, whichever takes longer), so a step of 90
long requests lasts longer than a step of 10:

    one at a time             one request runs, to its end, then the next: a server
                              with no batching (the seed's "traditional" server)
    max-length, static        each request reserves max_model_len contiguous slots; a
                              batch runs until its longest request is done
                              (FasterTransformer's scheme)
    max-length, continuous    the same reservations; requests join and leave at every
                              step (Orca (Max))
    paged, continuous         blocks of 16 tokens taken as requests grow (vLLM)

At a low request rate every server keeps up; as the rate grows each one reaches the rate
past which requests queue without end and latency explodes. That rate is the server's
throughput, as the paper reads its Fig. 12: the highest rate at which the normalized
latency (end-to-end seconds per output token, averaged over requests) stays under a
limit.

    sweep(rates)                 every server at every rate: rate -> name -> SimResult
    sustained_rate(runs, limit)  the highest rate whose normalized latency is <= limit
    format_servers(results)      a table of one rate's servers, paged's lead over each

    python -m kvlab.sim.servers  the four servers flat out (every request at once)

Not handled: prefix sharing, chunked prefill, swapping (the simulator's limits), and
latency limits other than the mean normalized latency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvlab.engine.step_cost import Roofline
from kvlab.memory import KVSpec, preset
from kvlab.sim.metrics import SimResult
from kvlab.sim.simulator import simulate
from kvlab.sim.trace import make_trace

SERVERS = {
    "one at a time": dict(
        allocator="contiguous", reservation_policy="max_model_len", max_num_seqs=1
    ),
    "max-length, static": dict(
        allocator="contiguous", reservation_policy="max_model_len", batching="static"
    ),
    "max-length, continuous": dict(allocator="contiguous", reservation_policy="max_model_len"),
    "paged, continuous": dict(allocator="paged", block_size=16),
}
LATENCY_LIMIT = 0.1  # seconds per output token: about ten times an unloaded A100's


def sweep(
    rates: Sequence[float],
    num_requests: int = 500,
    spec: KVSpec | str = "llama-2-7b",
    gpu: str = "a100-40gb",
    seed: int = 0,
    servers: Sequence[str] = tuple(SERVERS),
    stop_after: float = 10 * LATENCY_LIMIT,
) -> dict[float, dict[str, SimResult]]:
    """Replay one trace per rate (the same lengths, arrivals scaled) on every server.

    Args:
        rates: requests per second (Poisson arrivals); ``math.inf`` brings every request
            at once, so each server runs flat out: its throughput.
        num_requests: requests per replay.
        spec, gpu: the model and the device (``kvlab.engine.step_cost.GPUS``).
        servers: which of ``SERVERS`` to replay.
        stop_after: a server is left out of the higher rates once its normalized latency
            passes this (it only gets worse), which keeps a sweep to seconds.

    Returns:
        rate -> server name -> ``SimResult``, rates in increasing order.
    """
    spec = preset(spec) if isinstance(spec, str) else spec
    unknown = [s for s in servers if s not in SERVERS]
    if unknown:
        raise ValueError(f"servers={unknown!r} are not allowed: choose from {list(SERVERS)}")
    if not rates or min(rates) <= 0:
        raise ValueError(
            f"rates={list(rates)!r} is not allowed: give rates > 0 (math.inf: all at once)"
        )
    cost = Roofline.of(spec, gpu)
    runs: dict[float, dict[str, SimResult]] = {}
    live = list(servers)
    for rate in sorted(rates):
        trace = make_trace(num_requests, "sharegpt", rate, seed, spec.max_model_len)
        runs[rate] = {name: simulate(trace, spec, step_cost=cost, **SERVERS[name]) for name in live}
        live = [n for n in live if runs[rate][n].normalized_latency <= stop_after]
    return runs


def sustained_rate(
    runs: dict[float, dict[str, SimResult]], name: str, limit: float = LATENCY_LIMIT
) -> float | None:
    """The highest rate of ``sweep``'s runs at which ``name``'s normalized latency is at
    most ``limit`` (None if it is above it at every rate)."""
    held = [rate for rate, by_name in runs.items() if name in by_name]
    held = [rate for rate in held if runs[rate][name].normalized_latency <= limit]
    return max(held) if held else None


def format_servers(results: dict[str, SimResult]) -> str:
    """A table of the servers of one rate: requests and tokens per second, latency, and
    how many times paged's throughput each one's is."""
    paged = results.get("paged, continuous")
    header = (
        f"{'server':<24}{'requests/s':>11}{'tokens/s':>10}{'TTFT p50':>10}{'E2E p50':>9}"
        f"{'E2E p99':>9}{'ms/step':>9}{'paged is':>10}"
    )
    lines = [header, "-" * len(header)]
    for name, r in results.items():
        lead = f"{paged.throughput / r.throughput:.1f}x" if paged else "-"
        lines.append(
            f"{name:<24}{r.throughput:>11.2f}{r.tokens_per_s:>10.0f}{r.ttft_p50:>9.1f}s"
            f"{r.e2e_p50:>8.1f}s{r.e2e_p99:>8.1f}s{1000 * r.sim_seconds / r.num_steps:>9.1f}"
            f"{lead:>10}"
        )
    return "\n".join(lines)


def main(num_requests: int = 1000) -> None:
    runs = sweep([math.inf], num_requests=num_requests)
    print(
        f"{num_requests} ShareGPT-like requests, all at once, Llama-2-7B on an A100-40GB; each "
        "step priced by the A100's roofline (kvlab.engine.step_cost.Roofline)\n"
    )
    print(format_servers(runs[math.inf]))


if __name__ == "__main__":
    main()
