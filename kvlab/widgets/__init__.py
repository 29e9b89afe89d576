"""Live notebook views of the KV cache: the page map, the memory gauge, the batching panel.

Each also stores a static picture (SVG, or PNG for plotly figures once
``enable_static_figures()`` ran), so that GitHub and nbviewer show what a kernel would.

Widgets import from the rest of kvlab; nothing in kvlab imports widgets.
``BatchingPanel`` runs the engine and ``replay_failure`` the build-its' graders, so they are
imported on first use: ``import kvlab.widgets`` for a page map does not pay for importing
transformers.
"""

from __future__ import annotations

import importlib

from kvlab.widgets.block_table_diagram import BlockTableDiagram
from kvlab.widgets.memory_gauge import MemoryGauge, format_bytes
from kvlab.widgets.page_map import PageMap
from kvlab.widgets.page_map_state import seq_color
from kvlab.widgets.static_figures import enable_static_figures
from kvlab.widgets.step_view import PoolSnapshot, StepView

_LAZY = {
    "BatchingPanel": "kvlab.widgets.batching_panel",
    "replay_failure": "kvlab.widgets.failure_replay",  # the build-its of labs 02, 03, 06
}

__all__ = [
    "BatchingPanel",
    "BlockTableDiagram",
    "MemoryGauge",
    "PageMap",
    "PoolSnapshot",
    "StepView",
    "enable_static_figures",
    "format_bytes",
    "replay_failure",
    "seq_color",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kvlab.widgets' has no attribute {name!r}")
