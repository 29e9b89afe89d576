"""Live notebook views of the KV cache: the page map and the memory gauge.

Widgets import from the rest of kvlab; nothing in kvlab imports widgets.
"""

from kvlab.widgets.memory_gauge import MemoryGauge, format_bytes
from kvlab.widgets.page_map import PageMap, seq_color

__all__ = ["MemoryGauge", "PageMap", "format_bytes", "seq_color"]
