"""Python side of the batching panel: sliders replay the trace and change what is drawn.

The browser test moves a slider in JupyterLab and watches the plot and the page map; these
tests pin the same chain in Python: a slider's value -> a replay -> new figure data and a
new page-map state, with the page map updated during the run, not only after it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import plotly.graph_objects as go
import pytest

from kvlab.engine.step_cost import Roofline
from kvlab.memory import preset
from kvlab.widgets import BatchingPanel
from kvlab.widgets.batching_figures import comparison_figure, panel_figure, timeline_figure
from kvlab.widgets.batching_panel import DEBOUNCE_S, PanelSettings

KNOBS = (
    "max_num_seqs",
    "batch_timeout",
    "block_size",
    "num_blocks",
    "max_num_batched_tokens",
    "arrival_rate",
)
SMALL = dict(num_requests=6, max_output_len=8)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def panel() -> BatchingPanel:
    return BatchingPanel(**SMALL)


def plotted(panel: BatchingPanel) -> str:
    """Everything the two plots show (data and layout), as the browser receives it."""
    return json.dumps([panel.figure.to_dict(), panel.comparison.to_dict()], sort_keys=True)


def page_map_state(panel: BatchingPanel) -> tuple:
    pm = panel.page_map
    return (pm.title, pm.num_blocks, tuple(pm.owner), tuple(pm.num_filled), pm.summary)


def test_the_panel_and_its_sliders_carry_css_classes_for_the_browser(panel):
    assert "kvlab-batching-panel" in panel._dom_classes
    for name in KNOBS:
        slider = panel.sliders[name]
        assert f"kvlab-slider-{name}" in slider._dom_classes
        assert slider.continuous_update is False
    assert "kvlab-slider-step" in panel.step_slider._dom_classes
    assert "kvlab-toggle-scheduling" in panel.scheduling._dom_classes


def test_the_first_replay_draws_plotly_json_into_output_areas(panel):
    assert panel.error is None
    assert set(panel.results) == {"static", "dynamic", "continuous"}
    for output in (panel.plot, panel.comparison_plot):
        (shown,) = output.outputs
        figure = shown["data"]["application/vnd.plotly.v1+json"]
        assert figure["data"]  # traces, as plain JSON
    assert isinstance(panel.figure, go.Figure)
    assert panel.page_map.num_blocks == panel.settings.num_blocks
    assert "(fullest)" in panel.page_map.title  # rests on the fullest step
    assert repr(panel).startswith("BatchingPanel(continuous: 6 requests")


def test_a_slider_change_replays_and_changes_the_plots_and_the_page_map(panel):
    before_plot, before_map = plotted(panel), page_map_state(panel)
    replays = panel.num_replays
    updates = []
    panel.page_map.observe(lambda change: updates.append(change["new"]), names="owner")
    panel.sliders["max_num_seqs"].value = 1
    assert panel.num_replays == replays + 3  # the selected policy, then the two others
    assert panel.settings.max_num_seqs == 1
    assert plotted(panel) != before_plot
    assert page_map_state(panel) != before_map
    # The page map moved during the run (on_step), not only once at the end.
    assert len(updates) > 5


@pytest.mark.parametrize(
    "name, value",
    [
        ("max_num_seqs", 2),
        ("batch_timeout", 0.5),
        ("block_size", 4),
        ("num_blocks", 32),
        ("max_num_batched_tokens", 16),
        ("arrival_rate", 2.0),
    ],
)
def test_every_slider_changes_what_is_plotted(panel, name, value):
    before_data = [panel.figure.to_dict()["data"], panel.comparison.to_dict()["data"]]
    panel.sliders[name].value = value
    assert panel.error is None
    assert getattr(panel.settings, name) == value
    after_data = [panel.figure.to_dict()["data"], panel.comparison.to_dict()["data"]]
    assert after_data != before_data


def test_the_scheduling_toggle_redraws_the_timeline(panel):
    before = panel.figure.to_dict()["data"]
    panel.scheduling.value = "static"
    assert panel.settings.scheduling == "static"
    assert panel.figure.to_dict()["data"] != before
    assert panel.page_map.title.startswith("static:")


def test_set_moves_several_controls_and_replays_once(panel):
    replays = panel.num_replays
    panel.set(scheduling="dynamic", batch_timeout=0.5, max_num_seqs=8)
    assert panel.num_replays == replays + 3
    assert panel.sliders["batch_timeout"].value == 0.5
    assert panel.scheduling.value == "dynamic"
    assert panel.summary_text().startswith("dynamic:")


def test_the_step_slider_scrubs_the_page_map_through_the_run(panel):
    steps = panel.results[panel.settings.scheduling].metrics.steps
    assert panel.step_slider.max == len(steps) - 1
    panel.step_slider.value = 0
    assert "after step 0," in panel.page_map.title
    first = panel.page_map.counts
    panel.step_slider.value = panel.step_slider.max
    last = panel.page_map.counts
    assert first.used > 0 and last.used == 0  # everything finished and was freed
    assert panel.gauge.summary  # the gauge follows the same step


def test_a_bad_combination_is_explained_and_keeps_the_last_plots(panel):
    panel.sliders["block_size"].value = 1
    figure = panel.figure
    panel.sliders["num_blocks"].value = 4  # 4 tokens of KV: no request fits
    assert panel.error is not None and "KV blocks" in panel.error
    assert "Not replayed" in panel.status.value
    assert panel.figure is figure
    assert repr(panel).startswith("BatchingPanel(not replayed")
    panel.sliders["num_blocks"].value = 256
    assert panel.error is None and panel.figure is not figure


def test_a_refused_replay_greys_out_the_last_results_and_names_a_slider(panel):
    assert "kvlab-stale" not in panel.results_box._dom_classes
    panel.set(block_size=1, num_blocks=4)
    assert "kvlab-stale" in panel.results_box._dom_classes
    assert "block_size=8, num_blocks=64" in panel.status.value  # what is still shown
    # The engine's advice ("lower max_tokens") names a knob the panel has no slider for;
    # the panel's names its own sliders, with a value that works.
    advice = panel.error.split(": move ")[1]
    assert "max_tokens" not in panel.status.value
    assert advice.startswith("num_blocks to ") and "block_size up" in advice, advice
    enough = int(advice.removeprefix("num_blocks to ").split()[0])
    panel.sliders["num_blocks"].value = enough - 4  # one step short: still refused
    assert panel.error is not None
    panel.sliders["num_blocks"].value = enough
    assert panel.error is None
    assert "kvlab-stale" not in panel.results_box._dom_classes


def test_a_refusal_with_no_num_blocks_on_the_slider_names_block_size_only(panel):
    """A request longer than 512 blocks of block_size 1 (a model with a long context):
    no num_blocks on the slider holds it, so only block_size is advised."""
    from kvlab.measure.replay import TraceRequests

    settings = replace(panel.settings, block_size=1, num_blocks=512)
    llm = panel._replays.llm(settings, "continuous")
    llm.engine.max_model_len = 2048  # the tiny model's context is 512 tokens
    requests = TraceRequests([[1] * 600], [8], [0.0])
    refusal = panel._replays.refusal(llm, requests)
    assert refusal.startswith("r0 needs 608 KV blocks (600 prompt + 8 output tokens")
    assert refusal.endswith("num_blocks=512: move block_size up (a block holds block_size tokens)")


def test_quick_slider_moves_in_a_kernel_cost_one_replay(panel):
    """In a kernel (a running event loop) each move waits DEBOUNCE_S for the next; the
    last value wins. Three moves 50 ms apart: one replay (of three policies), not three."""
    replays = panel.num_replays

    async def three_quick_moves() -> None:
        for value in (1, 2, 3):
            panel.sliders["max_num_seqs"].value = value
            await asyncio.sleep(0.05)
        assert panel.num_replays == replays  # nothing yet: waiting for the next move
        await asyncio.sleep(DEBOUNCE_S + 0.1)  # the replay runs in the loop, then this ends

    asyncio.run(three_quick_moves())
    assert panel.num_replays == replays + 3  # the selected policy, then the two others
    assert panel.settings.max_num_seqs == 3


def test_run_replays_at_once_and_drops_a_waiting_move(panel):
    replays = panel.num_replays

    async def move_then_run() -> None:
        panel.sliders["max_num_seqs"].value = 2
        panel.run()  # the button: at once, with the slider's new value
        await asyncio.sleep(DEBOUNCE_S + 0.1)

    asyncio.run(move_then_run())
    assert panel.num_replays == replays + 3 and panel.settings.max_num_seqs == 2


def test_the_pool_and_the_plots_share_a_row_with_the_gauge_over_the_map(panel):
    assert list(panel.results_box.children) == [panel.pool, panel.plots]
    assert list(panel.pool.children) == [panel.gauge, panel.page_map]
    assert list(panel.plots.children) == [panel.plot, panel.comparison_plot]
    # Compact: 16 requests' timeline and load in less than a laptop's notebook area.
    assert BatchingPanel(run=False).figure is None
    assert panel_figure(panel.results["continuous"], "t").layout.height < 400


def test_the_pool_shows_no_cached_block_unless_prefix_caching_is_asked_for(panel):
    """Lab 04 meets the panel before lab 06 teaches prefix caching: no hatched blocks."""

    def steps_with_a_hashed_block(p: BatchingPanel) -> int:
        return sum(any(block.cached for block in s.infos) for s in p._snapshots)

    assert steps_with_a_hashed_block(panel) == 0
    cached = BatchingPanel(**SMALL, enable_prefix_caching=True)
    assert steps_with_a_hashed_block(cached) > 0
    assert repr(cached) == repr(panel)  # the same replay: only the pool's marks differ


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_num_seqs=0), "max_num_seqs=0 is not allowed"),
        (dict(max_num_seqs=2.5), "max_num_seqs=2.5 is not allowed"),
        (dict(batch_timeout=-1), "batch_timeout=-1"),
        (dict(block_size=3), r"block_size=3 is not allowed: use one of \(1, 2, 4"),
        (dict(num_blocks=1), "num_blocks=1"),
        (dict(max_num_batched_tokens=8), "max_num_batched_tokens=8"),
        (dict(arrival_rate=0), "arrival_rate=0"),
        (dict(scheduling="fifo"), "scheduling='fifo'"),
        (dict(num_requests=0), "num_requests=0"),
        (dict(max_output_len=0), "max_output_len=0"),
        (dict(lengths="chat"), "lengths='chat'"),
        (dict(step_seconds=0), "step_seconds=0"),
        (dict(preemption_mode="drop"), "preemption_mode='drop'"),
        (dict(watermark=1.0), "watermark=1.0"),
        (dict(enable_prefix_caching="yes"), "enable_prefix_caching='yes' is not allowed"),
        (dict(model=42), "model=42"),
    ],
)
def test_bad_values_are_refused_with_the_name_and_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchingPanel(run=False, **kwargs)


def test_unknown_settings_are_refused():
    with pytest.raises(TypeError, match="max_batch_size"):
        BatchingPanel(run=False, max_batch_size=4)


def test_settings_match_the_slider_ranges():
    settings = PanelSettings()
    panel = BatchingPanel(run=False, compare=False, **SMALL)
    for name in KNOBS:
        assert panel.sliders[name].value == getattr(settings, name)
    assert panel.status.value == "not run yet"
    panel.run()
    assert list(panel.results) == ["continuous"] and panel.num_replays == 1


def test_figure_helpers_draw_one_row_or_line_per_run(panel):
    results = panel.results
    timeline = timeline_figure(results)
    assert len({t.yaxis for t in timeline.data}) == 3
    comparison = comparison_figure(results)
    assert list(comparison.data[0].x) == list(results)


def test_on_a_step_cost_clock_the_token_budget_trades_stalls_for_ttft():
    a100 = Roofline.of(preset("llama-2-7b"), "a100-40gb")
    panel = BatchingPanel(
        lengths="sharegpt",
        step_cost=a100,
        compare=False,
        num_blocks=512,
        max_num_seqs=8,
        max_output_len=32,
        run=False,
    )
    summaries = {}
    for budget in (16, 512):
        panel.set(max_num_batched_tokens=budget)
        summaries[budget] = panel.results["continuous"].summary
    small, large = summaries[16], summaries[512]
    assert small["max_token_gap_p99"] < large["max_token_gap_p99"]  # chunks: no stall
    assert small["ttft_p99"] > 3 * large["ttft_p99"]  # the long prompts wait for their chunks
    assert "longest token gap p99" in panel.summary_text()


def test_a_step_cost_without_seconds_is_refused():
    with pytest.raises(ValueError, match="cost=3 is not allowed"):
        BatchingPanel(step_cost=3, run=False)


def test_a_quiet_panel_draws_the_pool_once_per_replay(monkeypatch):
    from kvlab.widgets.step_view import StepView

    live_draws = []
    monkeypatch.setattr(StepView, "show_live", lambda self, *args: live_draws.append(args))
    quiet = BatchingPanel(compare=False, live=False)
    assert len(live_draws) == 1 and len(quiet._snapshots) > 1  # recorded, drawn at the end
    BatchingPanel(compare=False)
    assert len(live_draws) == 1 + len(quiet._snapshots) + 1  # live: every step, then the end


def test_the_time_axis_spans_the_plot_area_of_the_png(panel):
    from kvlab.widgets.batching_figures import PANEL_MARGIN, time_axis_px
    from kvlab.widgets.static_figures import SIZE

    first, last = panel.figure.layout.xaxis.range
    assert first == 0 and last >= max(s.time for s in panel.pool.snapshots)
    assert time_axis_px(panel.figure, first) == PANEL_MARGIN[0]
    assert time_axis_px(panel.figure, last) == SIZE[0] - PANEL_MARGIN[1]


def test_the_static_copy_plays_the_replay_under_its_timeline(panel):
    from test_animation import frames

    from kvlab.widgets.static_figures import figure_png

    if figure_png(panel.figure) is None:
        pytest.skip("no browser for kaleido: the panel's static copy is the pool's SVG")
    indices, _ = panel.pool.animation_steps()
    animation = panel.to_animation()
    shown = frames(animation.png)
    assert len(shown) == len(indices) > 1
    assert list(shown[0].getdata()) != list(shown[len(shown) // 2].getdata())
    bundle, _ = panel._repr_mimebundle_()
    assert "image/png" in bundle and "image/svg+xml" not in bundle
