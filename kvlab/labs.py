"""Helpers the allocator labs share, so that no notebook pastes library code.

    live_view(cache, title, weight_bytes)   a page map and a memory gauge of ``cache``,
                                            shown now; returns both widgets
    watch(page_map, gauge, history, ...)    an ``on_step`` callback for
                                            ``kvlab.measure.serve.serve``: redraw
                                            both, record the cache's fragmentation
    describe_fullest(history, label)        the step where a cache held the most tokens,
                                            in words, and the mean use over all steps

Not handled: the engine's widgets (lab 04's batching panel is ``kvlab.widgets``).
"""

from __future__ import annotations

from collections.abc import Callable

from IPython.display import display

from kvlab.cache.base import PooledKVCache
from kvlab.measure.experiments import Fragmentation, fragmentation
from kvlab.widgets import MemoryGauge, PageMap, format_bytes


def live_view(cache: PooledKVCache, title: str, weight_bytes: int) -> tuple[PageMap, MemoryGauge]:
    """Show a page map and a memory gauge of ``cache`` now; ``watch`` redraws them."""
    page_map = PageMap(cache, title=title)
    gauge = MemoryGauge(cache, weight_bytes=weight_bytes, title=title)
    display(page_map, gauge)
    return page_map, gauge


def watch(
    page_map: PageMap,
    gauge: MemoryGauge,
    history: list[Fragmentation],
    request_size: int | None = None,
    tables: list[dict[int, list[int]]] | None = None,
) -> Callable[[int, PooledKVCache], None]:
    """An ``on_step(step, cache)`` callback: redraw both widgets, append the cache's
    fragmentation to ``history`` and, if ``tables`` is given, every block table."""

    def on_step(step: int, cache: PooledKVCache) -> None:
        page_map.update(cache)
        gauge.update(cache)
        history.append(fragmentation(cache, request_size))
        if tables is not None:
            tables.append({s: cache.block_table(s) for s in cache.manager.seq_ids()})

    return on_step


def describe_fullest(history: list[Fragmentation], label: str) -> tuple[str, Fragmentation]:
    """The step of ``history`` where the cache held the most tokens, described in words.

    Returns:
        the text, and that step's ``Fragmentation``.
    """
    peak = max(history, key=lambda f: f.used)
    step = history.index(peak)
    mean_use = sum(f.used / f.reserved for f in history) / len(history)
    text = (
        f"{label}, at its fullest (step {step}):\n"
        f"  {peak}\n"
        f"  reserved {peak.reserved:,} slots ({format_bytes(peak.reserved * peak.bytes_per_slot)})"
        f", of which {peak.used / peak.reserved:.1%} hold tokens; "
        f"mean over {len(history)} steps: {mean_use:.1%}"
    )
    return text, peak
