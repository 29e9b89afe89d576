"""The runner's fused, relaid matrices compute what the model's own layers compute.

The oracle is each ``nn.Linear`` of the Hugging Face model, called on its own: the fused
q|k|v and gate|up matrices, in either layout, must give the same outputs to float32
rounding (a different order of additions), biases included (the Qwen2-style tiny model).
"""

from __future__ import annotations

import pytest
import torch

from kvlab.cache.paged import PagedKVCache
from kvlab.model.greedy import greedy_generate
from kvlab.model.linear import FusedLinear, fused_weights
from kvlab.model.loading import load_model
from kvlab.model.runner import ModelRunner

LAYOUTS = [False, pytest.param(True, marks=pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN"))]  # fmt: skip


@pytest.mark.parametrize("onednn", LAYOUTS)
def test_fused_projections_equal_the_models_own(tiny, onednn):
    layer = tiny.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    x = torch.randn(5, tiny.config.hidden_size, generator=torch.Generator().manual_seed(0))
    groups = [[attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj], [tiny.lm_head]]
    with torch.no_grad():
        for linears in groups:
            fused = FusedLinear(linears, onednn)
            assert fused.onednn is onednn
            for ours, theirs in zip(fused.split(x), linears, strict=True):
                torch.testing.assert_close(ours, theirs(x), atol=1e-5, rtol=1e-5)


def test_each_layout_gives_the_same_tokens(tiny):
    prompts = [list(range(3, 19)), list(range(40, 45))]
    tokens = []
    for onednn in [None, False]:
        runner = ModelRunner(tiny, attention="sdpa", onednn=onednn)
        cache = PagedKVCache.from_spec(runner.kv_spec(), num_blocks=32, block_size=4)
        tokens.append(greedy_generate(runner, cache, prompts, 12))
    assert tokens[0] == tokens[1]


def test_weights_are_fused_once_per_model_and_again_after_a_move():
    model, _ = load_model("tiny", device="cpu")
    first = ModelRunner(model).weights
    assert ModelRunner(model, attention="sdpa").weights is first  # shared, not copied
    assert fused_weights(model, onednn=False) is not first
    model.to(torch.float64)
    moved = ModelRunner(model).weights
    assert moved.lm_head.weight.dtype == torch.float64 and not moved.onednn


def test_onednn_where_it_cannot_apply_is_refused():
    model, _ = load_model("tiny", device="cpu", dtype=torch.float64)
    with pytest.raises(ValueError, match="onednn=True needs float32 weights on a CPU"):
        FusedLinear([model.lm_head], onednn=True)


def test_decode_step_benchmark_times_every_method():
    """Every method, and the custom ops' step where they build."""
    from kvlab.measure.decode_step import CUSTOM_OPS, METHODS, decode_step_times
    from kvlab.model import custom_ops

    model, _ = load_model("tiny", device="cpu")
    times = decode_step_times(model, batch_size=3, context=9, rounds=2, block_size=4)
    custom = {CUSTOM_OPS} if custom_ops.available() else set()
    assert set(times) == {*METHODS, *custom} and all(t > 0 for t in times.values())


def test_decode_step_by_part_times_each_part_and_leaves_the_rest_to_the_step():
    from kvlab.measure.decode_step import (
        CUSTOM_IN_STEP,
        IN_STEP,
        PARTS,
        decode_step_parts,
        format_parts,
    )
    from kvlab.model import custom_ops

    model, _ = load_model("tiny", device="cpu")
    times = decode_step_parts(model, batch_size=3, context=9, rounds=2, block_size=4)
    inside = {f"{name} in step" for name in IN_STEP}
    custom = {f"{name} in custom" for name in (*CUSTOM_IN_STEP, "step")}
    if custom_ops.available():
        assert custom <= set(times)
        wrapped = ("matmuls", "attention", "norms and adds", "activation", "rotary")
        assert all(times[f"{name} in custom"] > 0 for name in wrapped)
        assert times["rest in custom"] >= 0
        assert "the custom ops' step" in format_parts(3, times, {"weights": 4, "K/V": 1})
        times = {name: t for name, t in times.items() if name not in custom}
    assert set(times) == {"step", *PARTS, "rest", "plain read", *inside}
    assert all(times[name] > 0 for name in ("step", *PARTS, "plain read", *inside))
    assert times["rest"] == pytest.approx(times["step"] - sum(times[name] for name in PARTS))
    table = format_parts(3, times, {"weights": 4_000_000, "K/V": 1_000_000})
    assert table.startswith("batch 3: kvlab's step") and all(name in table for name in PARTS)


def test_timing_parts_inside_a_step_leaves_the_runner_as_it_was():
    """The in-step timing wraps the runner's functions for one step: afterwards the same
    objects are in place, and a step computes what it computed before."""
    from kvlab.cache.base import ForwardBatch
    from kvlab.measure.decode_step import IN_STEP, _parts_in_step
    from kvlab.model import runner as runner_module

    model, _ = load_model("tiny", device="cpu")
    runner = ModelRunner(model)
    cache = PagedKVCache.from_spec(runner.kv_spec(), num_blocks=8, block_size=4)
    cache.allocate_slots(0, 3)
    batch, ids = ForwardBatch.build([0], [0], [3]), torch.tensor([5, 6, 7])
    expected = runner.forward(ids, batch, cache)
    before = (FusedLinear.__call__, runner.attention, runner_module.rms_norm, vars(cache).copy())
    spent = _parts_in_step(runner, ids, batch, cache)
    assert set(spent) == {*IN_STEP, "step"} and spent["matmuls"] > 0 and spent["norms"] > 0
    after = (FusedLinear.__call__, runner.attention, runner_module.rms_norm, vars(cache).copy())
    assert after == before and "rotary" not in vars(runner)
    torch.testing.assert_close(runner.forward(ids, batch, cache), expected, rtol=0, atol=0)


def test_timing_the_custom_ops_inside_a_step_leaves_them_as_they_were():
    from kvlab.cache.base import ForwardBatch
    from kvlab.measure.decode_step import CUSTOM_IN_STEP, _parts_in_step
    from kvlab.model import custom_ops

    if not custom_ops.available():
        pytest.skip("no C compiler could build the custom ops")
    model, _ = load_model("tiny", device="cpu")
    runner = custom_ops.CustomOpsRunner(model)
    cache = PagedKVCache.from_spec(runner.kv_spec(), num_blocks=8, block_size=4)
    cache.allocate_slots(0, 3)
    batch, ids = ForwardBatch.build([0], [0], [3]), torch.tensor([5, 6, 7])
    expected = runner.forward(ids, batch, cache)
    ops = ("fused_add_rms_norm", "silu_and_mul", "rotary_embedding")
    before = [getattr(custom_ops, name) for name in ops]
    spent = _parts_in_step(runner, ids, batch, cache)
    assert set(spent) == {*CUSTOM_IN_STEP, "step"}
    assert all(spent[part] > 0 for part in ("norms and adds", "activation", "rotary"))
    assert [getattr(custom_ops, name) for name in ops] == before
    torch.testing.assert_close(runner.forward(ids, batch, cache), expected, rtol=0, atol=0)


def test_the_by_part_table_gives_each_rate_and_share():
    """Made-up times whose rates and shares all differ: 6 GB of weights in 2 s (3 GB/s),
    1 GB of K/V in 0.5 s (2 GB/s), a plain pass over the 6 GB in 1 s (6 GB/s)."""
    from kvlab.measure.decode_step import PARTS, format_parts

    times = dict.fromkeys(PARTS, 0.01) | {"matmuls": 2.0, "attention": 0.5, "plain read": 1.0}
    times |= {"step": 4.0, "rest": 4.0 - sum(times[name] for name in PARTS)}
    table = format_parts(8, times, {"weights": 6_000_000_000, "K/V": 1_000_000_000})
    assert "weights 6000 MB by the matmuls (3.0 GB/s)" in table
    assert "K/V 1000 MB by attention (2.0 GB/s)" in table
    assert "a plain pass reads 6.0 GB/s" in table
    # no in-step times: one column
    assert "  matmuls        2000.0 ms  50%\n" in table and "in the step" not in table
    # 2 / 4; 2 / (2 + 0.5); 2 / (2 + 1 GB at 6 GB/s)
    assert "matmuls / step: 0.50; with all but the matmuls and attention free: 0.80" in table
    assert "and 0.92 if attention read at the plain pass's rate" in table


def test_a_decode_step_reads_every_projection_weight_and_every_cached_token():
    """The weights are counted from the model's parameters, the K/V from its runner's spec
    (which reads a config's own head_dim)."""
    from kvlab.measure.decode_step import bytes_read

    for name in ("tiny", "tiny-qwen2"):
        model, _ = load_model(name, device="cpu")
        projections = [p for n, p in model.named_parameters() if n.endswith("proj.weight")]
        assert len(projections) == 7 * model.config.num_hidden_layers
        weights = sum(p.numel() for p in projections) + model.lm_head.weight.numel()
        kv = 3 * 10 * ModelRunner(model).kv_spec().bytes_per_token
        assert bytes_read(model, batch_size=3, context=9) == {"weights": 4 * weights, "K/V": kv}
