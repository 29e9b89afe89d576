"""The memory gauge: the KV pool on a bar of its own, and all memory on a thin bar below.

The bars answer the allocator labs' question (how much of the KV pool holds real tokens?)
and lab 01's (where does serving memory go?):

    KV pool:     | KV used | KV reserved, unused | KV free |        percentages of the pool
    all memory:  | weights | KV pool | other | torch cache | outside | free |   of the total
                                       |<------------ CUDA only ------------>|

The pool gets its own scale because on a small model the weights take 85-98% of memory:
on one shared bar the part each allocator lab is about would be a sliver.

``KV used`` holds tokens of live sequences; ``KV reserved, unused`` is held by sequences but
empty (a contiguous arena's over-reservation, a paged block's unfilled tail); ``KV free`` is
the rest of the pool. On a CUDA device the bar goes on to the whole device, read from
``torch.cuda.mem_get_info`` and the caching allocator's counters. ``update`` only reassigns
a few small traitlets, so it can run after every engine step.

Wherever no kernel runs the widget (GitHub, nbviewer, an HTML export), its output shows an
SVG of the same state (``to_svg``) and its text (``to_text``).

Not handled: activations and temporary buffers (they show up as "other tensors" on CUDA
only), several devices at once, memory over time (the engine's stats do that).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import anywidget
import torch
import traitlets as t

from kvlab.cache.base import CacheUsage
from kvlab.memory import GIB, MIB
from kvlab.widgets.svg import FREE, gauge_svg, with_static_copy

_HERE = Path(__file__).parent
KIB = 2**10

# "KV free" is the page map's free grey: one colour, one meaning, in a view showing both.
# "KV reserved, unused" is drawn hollow (``HOLLOW``), as a reserved cell of the map is, so
# that it differs from used and free in shape too; tests/test_colours.py checks the rest.
COLORS = {
    "weights": "#5b6b8c",
    "KV used": "#2e9e5b",
    "KV reserved, unused": "#f0a73a",
    "KV free": FREE,
    "other tensors": "#a77fc2",
    "torch cache": "#d7c3e6",
    "outside torch": "#8c8c8c",
    "device free": "#f4f4f4",
}
HOLLOW = frozenset({"KV reserved, unused"})


def format_bytes(num_bytes: int) -> str:
    """Bytes as people read them: ``512 B``, ``3.0 KiB``, ``12.5 MiB``, ``1.50 GiB``."""
    if num_bytes < KIB:
        return f"{num_bytes} B"
    if num_bytes < MIB:
        return f"{num_bytes / KIB:.1f} KiB"
    if num_bytes < GIB:
        return f"{num_bytes / MIB:.1f} MiB"
    return f"{num_bytes / GIB:.2f} GiB"


@dataclass(frozen=True)
class CudaMemory:
    """One CUDA device's memory, as the driver and PyTorch's caching allocator see it.

    Attributes:
        total_bytes: the device's memory.
        free_bytes: not held by anyone (driver view).
        reserved_bytes: held by PyTorch's caching allocator.
        allocated_bytes: in live tensors (a part of reserved).
    """

    total_bytes: int
    free_bytes: int
    reserved_bytes: int
    allocated_bytes: int

    @classmethod
    def read(cls, device: torch.device | str | int | None = None) -> CudaMemory:
        free, total = torch.cuda.mem_get_info(device)
        return cls(
            total_bytes=total,
            free_bytes=free,
            reserved_bytes=torch.cuda.memory_reserved(device),
            allocated_bytes=torch.cuda.memory_allocated(device),
        )


@dataclass(frozen=True)
class Segment:
    """One stretch of a bar.

    Attributes:
        kv: part of the KV pool (drawn on the pool's own bar too).
        share: of the KV pool for a KV stretch, of all memory for the others.
        hollow: drawn as a frame of ``color`` rather than filled with it.
    """

    name: str
    num_bytes: int
    label: str
    color: str
    kv: bool
    share: float
    hollow: bool = False


def usage_of(source) -> CacheUsage:
    """``source.usage()`` for a cache, or ``source`` itself when it already is a usage."""
    usage = source.usage() if hasattr(source, "usage") else source
    for field in ("capacity_bytes", "reserved_bytes", "used_bytes"):
        if not isinstance(getattr(usage, field, None), int):
            raise TypeError(
                f"the memory gauge needs a cache with usage() or a CacheUsage, "
                f"got {type(source).__name__} (no int {field})"
            )
    if not 0 <= usage.used_bytes <= usage.reserved_bytes <= usage.capacity_bytes:
        raise ValueError(
            "cache usage must satisfy 0 <= used_bytes <= reserved_bytes <= capacity_bytes, got "
            f"used {usage.used_bytes}, reserved {usage.reserved_bytes}, "
            f"capacity {usage.capacity_bytes}"
        )
    return usage


def gauge_segments(
    usage: CacheUsage, weight_bytes: int, cuda: CudaMemory | None = None
) -> list[Segment]:
    """The bar's stretches, left to right; on CUDA they add up to the device's total.

    Args:
        usage: the KV pool's bytes (checked by ``usage_of``).
        weight_bytes: the model's parameter bytes.
        cuda: the device's counters; None on CPU, where the bar is weights + KV pool.
    """
    sizes = {
        "weights": weight_bytes,
        "KV used": usage.used_bytes,
        "KV reserved, unused": usage.reserved_bytes - usage.used_bytes,
        "KV free": usage.capacity_bytes - usage.reserved_bytes,
    }
    if cuda is not None:
        known = weight_bytes + usage.capacity_bytes
        # NOTE: clamped at 0 because weights or the pool may live elsewhere (another
        # device, CPU offload); then the bar's total exceeds the device's a little.
        sizes["other tensors"] = max(0, cuda.allocated_bytes - known)
        sizes["torch cache"] = max(0, cuda.reserved_bytes - cuda.allocated_bytes)
        sizes["outside torch"] = max(0, cuda.total_bytes - cuda.free_bytes - cuda.reserved_bytes)
        sizes["device free"] = cuda.free_bytes
    total = sum(sizes.values())
    segments = []
    for name, n in sizes.items():
        kv = name.startswith("KV ")
        base = usage.capacity_bytes if kv else total
        share = n / base if base else 0.0
        segments.append(Segment(name, n, format_bytes(n), COLORS[name], kv, share, name in HOLLOW))
    return segments


def gauge_summary(usage: CacheUsage, weight_bytes: int, cuda: CudaMemory | None) -> str:
    """One line of numbers under the bars; every percentage is of the KV pool."""
    capacity = usage.capacity_bytes

    def part(num_bytes: int) -> str:
        return f"{format_bytes(num_bytes)} ({num_bytes / capacity:.1%})" if capacity else "0 B"

    text = (
        f"KV pool {format_bytes(capacity)}: {part(usage.used_bytes)} used, "
        f"{part(usage.reserved_bytes - usage.used_bytes)} reserved but unused, "
        f"{part(capacity - usage.reserved_bytes)} free; weights {format_bytes(weight_bytes)}"
    )
    if cuda is not None:
        text += f"; device {format_bytes(cuda.total_bytes)}, {format_bytes(cuda.free_bytes)} free"
    return text


def _cuda_device_of(device, cache) -> torch.device | None:
    device = device if device is not None else getattr(cache, "device", None)
    if device is None:
        return None
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return device


class MemoryGauge(anywidget.AnyWidget):
    """A live bar of weights and KV-pool memory; call ``update`` after each engine step.

    Example:
        >>> weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        >>> gauge = MemoryGauge(cache, weight_bytes=weight_bytes)
        >>> gauge.update()          # after each step: re-reads cache.usage()
    """

    _esm = _HERE / "memory_gauge.js"
    _css = _HERE / "memory_gauge.css"

    title = t.Unicode("").tag(sync=True)
    device = t.Unicode("cpu").tag(sync=True)
    # [{"name", "num_bytes", "label", "color"}, ...] left to right; a handful, so dicts are fine.
    segments = t.List().tag(sync=True)
    total_bytes = t.Int(0).tag(sync=True)
    total_label = t.Unicode("0 B").tag(sync=True)
    kv_label = t.Unicode("0 B").tag(sync=True)
    kv_share = t.Float(0.0).tag(sync=True)  # the KV pool's share of all memory
    summary = t.Unicode("").tag(sync=True)

    def __init__(self, cache=None, weight_bytes: int = 0, device=None, title: str = "", **kwargs):
        super().__init__(title=title, **kwargs)
        self._cache = None
        self._weight_bytes = 0
        self._device = device
        self.update(cache, weight_bytes)

    def update(self, cache=None, weight_bytes: int | None = None) -> None:
        """Redraw from ``cache.usage()`` (or a CacheUsage); with no cache, from the last one."""
        if cache is not None:
            self._cache = cache
        if weight_bytes is not None:
            if not isinstance(weight_bytes, int) or weight_bytes < 0:
                raise ValueError(f"weight_bytes must be an int >= 0, got {weight_bytes!r}")
            self._weight_bytes = weight_bytes
        usage = usage_of(self._cache) if self._cache is not None else CacheUsage(0, 0, 0)
        cuda_device = _cuda_device_of(self._device, self._cache)
        cuda = CudaMemory.read(cuda_device) if cuda_device is not None else None
        segments = gauge_segments(usage, self._weight_bytes, cuda)
        total = sum(s.num_bytes for s in segments)
        with self.hold_sync():
            self.device = str(cuda_device) if cuda_device is not None else "cpu"
            self.segments = [asdict(s) for s in segments]
            self.total_bytes = total
            self.total_label = format_bytes(total)
            self.kv_label = format_bytes(usage.capacity_bytes)
            self.kv_share = usage.capacity_bytes / total if total else 0.0
            self.summary = gauge_summary(usage, self._weight_bytes, cuda)

    def to_text(self) -> str:
        """The title and the numbers: deterministic text on CPU for notebooks and tests."""
        return f"{self.title}: {self.summary}" if self.title else self.summary

    def to_svg(self, kv_only: bool = False) -> str:
        """A static picture of the gauge as it is now (``kvlab.widgets.svg``); ``kv_only``
        draws the KV pool's bar alone."""
        names = ("title", "device", "segments", "total_label", "kv_label", "kv_share", "summary")
        return gauge_svg({name: getattr(self, name) for name in names}, kv_only=kv_only)

    def _repr_mimebundle_(self, **kwargs):
        # The live view for JupyterLab, an SVG for GitHub, nbviewer and HTML exports.
        return with_static_copy(super()._repr_mimebundle_(**kwargs), repr(self), self.to_svg())

    def __repr__(self) -> str:
        return f"MemoryGauge({self.to_text()})"
