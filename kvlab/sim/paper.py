"""The PagedAttention paper's memory figures beside kvlab's: ``python -m kvlab.sim``.

``reproduce_seed`` replays one ShareGPT-like trace against every allocator in the seed
article's setting (Llama-2-7B on a 40 GB A100) or the paper's own (OPT-13B), and
``format_comparison`` prints kvlab's shares of KV memory beside the published ones.

Not handled: the paper's own traces and its Orca reimplementation (see ``PUBLISHED``).
"""

from __future__ import annotations

import time

from kvlab.memory import KVSpec, preset
from kvlab.sim.simulator import A100_40GB, SimResult, simulate
from kvlab.sim.trace import make_trace

PUBLISHED_POLICIES = ("max_model_len", "pow2", "exact")

# Share of KV memory holding token states in the PagedAttention paper's Fig. 2 (Kwon et al.,
# SOSP 2023: OPT-13B on an A100-40GB, ShareGPT). The paper's Orca reimplementation places
# requests with a buddy allocator (kvlab places first-fit); its Pow2 and Oracle reserve by
# each request's true output length, as kvlab's simulator does with a trace's lengths.
PUBLISHED = {
    "contiguous/max_model_len": (0.204, "PagedAttention paper Fig. 2, Orca (Max)"),
    "contiguous/clairvoyant-pow2": (0.268, "PagedAttention paper Fig. 2, Orca (Pow2)"),
    "contiguous/clairvoyant": (0.382, "PagedAttention paper Fig. 2, Orca (Oracle)"),
    "paged/16": (0.963, "PagedAttention paper Fig. 2, vLLM (the seed article says 96%)"),
}

# The whole bars of the paper's Fig. 2: shares of KV memory in token states, reservation (held
# for tokens still to come), internal fragmentation, and external fragmentation and other.
# None where the figure gives no number: Orca (Oracle)'s last part is "the rest" (its three
# others add up to 100.0%), and vLLM's bar is only labelled with its token states.
PUBLISHED_BREAKDOWN = {
    "contiguous/max_model_len": (0.204, 0.133, 0.573, 0.089),
    "contiguous/clairvoyant-pow2": (0.268, 0.179, 0.136, 0.416),
    "contiguous/clairvoyant": (0.382, 0.252, 0.366, None),
    "paged/16": (0.963, None, None, None),
}

# The paper's own Fig. 2 setting: OPT-13B (max length 2048) on a 40 GB A100, ShareGPT.
# Its shape is OPT-13B's config.json; the weight count is rounded (about 12.85 billion).
OPT_13B = KVSpec("opt-13b", 40, 40, 128, 2, 12_850_000_000, 2048)


def reproduce_seed(
    num_requests: int = 10_000,
    seed: int = 0,
    lengths: str = "sharegpt",
    arrival_rate: float = 20.0,
    spec: KVSpec | str = "llama-2-7b",
    gpu_memory_bytes: int = A100_40GB,
) -> list[SimResult]:
    """The seed article's setting, Llama-2-7B on a 40 GB A100: every allocator, one trace.

    Requests arrive faster than any allocator serves them (20 per second), so memory, not
    arrivals, limits how many run at once.
    """
    spec = preset(spec) if isinstance(spec, str) else spec
    trace = make_trace(num_requests, lengths, arrival_rate, seed, spec.max_model_len)
    runs = [dict(allocator="contiguous", reservation_policy=p) for p in PUBLISHED_POLICIES]
    runs.append(dict(allocator="paged", block_size=16))
    return [simulate(trace, spec, gpu_memory_bytes, **run) for run in runs]


def format_comparison(results: list[SimResult]) -> str:
    """A table of kvlab's figures beside the published ones, then the concurrency ratios.

    The first columns split the KV memory as the PagedAttention paper's Fig. 2 does (see
    ``kvlab.sim.simulator``): token states, the published share beside them, reservation
    (held for tokens a request will still generate), internal fragmentation (held past a
    request's final length: never used), external fragmentation (free, in holes too small
    for the request waiting) and free. Then used/res (slots in use / slots held), the
    requests running while one waited (fit at once) and the most running at once (peak).
    """
    header = (
        f"{'allocator':<26}{'token states':>13}{'published':>10}{'reservation':>12}{'internal':>9}"
        f"{'external':>9}{'free':>7}{'used/res':>9}{'fit at once':>12}{'peak':>6}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        published, _ = PUBLISHED.get(r.label, (None, ""))
        shown = f"{published:.1%}" if published is not None else "-"
        fit = f"{r.fit_at_once:.1f}" if r.fit_at_once is not None else "-"
        lines.append(
            f"{r.label:<26}{r.token_states:>13.1%}{shown:>10}{r.reserved_for_future:>12.1%}"
            f"{r.internal_fragmentation:>9.1%}{r.external_fragmentation:>9.1%}{r.free:>7.1%}"
            f"{r.utilization:>9.1%}{fit:>12}{r.peak_running:>6}"
        )
    paged = [r for r in results if r.label.startswith("paged")]
    if paged and paged[0].fit_at_once:
        lines.append("")
        for r in results:
            if r.label.startswith("contiguous") and r.fit_at_once:
                ratio = paged[0].fit_at_once / r.fit_at_once
                lines.append(f"{paged[0].label} fits {ratio:.1f}x the requests of {r.label}")
    return "\n".join(lines)


def main() -> None:
    for title, spec in (
        ("The seed article's setting: Llama-2-7B", "llama-2-7b"),
        ("The PagedAttention paper's Fig. 2 setting: OPT-13B", OPT_13B),
    ):
        start = time.perf_counter()
        results = reproduce_seed(spec=spec)
        elapsed = time.perf_counter() - start
        r = results[0]
        print(
            f"{title} on an A100-40GB (90% of memory, less the weights): "
            f"{r.capacity_slots} KV token slots, {r.num_requests} ShareGPT-like requests, "
            f"{elapsed:.1f} s for all four replays\n"
        )
        print(format_comparison(results), end="\n\n")
    print("Token states: share of KV memory holding tokens, while requests wait for memory.")
    print("Fit at once: requests running together while others wait.")
    for label, (_, source) in PUBLISHED.items():
        print(f"published {label}: {source}")


if __name__ == "__main__":
    main()
