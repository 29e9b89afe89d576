"""One decode step against the model's bare forward: ``python -m kvlab.measure.decode_step``.

A decode step computes one new token for each of ``B`` running sequences. Its floor is
the model's own forward pass over ``B`` one-token rows with no cache at all (attention
over a single key): the same matrix multiplies, nothing read back from memory. What a
serving engine adds on top is the price of its KV cache: writing this step's K/V, reading
every sequence's whole context back through the block table, attending to it. This
benchmark times, in interleaved rounds at each batch size:

    kvlab              ModelRunner.forward on a paged cache with kvlab's fastest backend
                       here ("cpu", the C kernel, where it builds; else "sdpa"): fused
                       q|k|v and gate|up matrices, laid out for oneDNN where it applies
    kvlab sdpa         the same with the SDPA backend (K/V gathered, then one SDPA call)
    kvlab custom ops   kvlab's step with its norms, residual adds, SiLU-and-multiply and rotary
                       embedding as three C calls (``kvlab.model.custom_ops``), where they build
    kvlab row-major    the SDPA step with the fused matrices kept row-major (``onednn=False``)
    matmuls only       kvlab's matrix multiplies of the step alone, nothing else: the floor
                       for any engine that does these multiplies in float32 (vLLM on a CPU
                       calls the same oneDNN kernels)
    bare forward       transformers' model on (B, 1) input ids, ``use_cache=False``
    kvlab compiled     with ``--compile``: kvlab's step with the work between attention
                       calls compiled by torch.compile (``kvlab.model.compiled``)

and prints milliseconds per step (the median of the rounds; each round runs the methods
in a new seeded order, so that none always follows the same one), ``bare / kvlab`` (1.0 means
kvlab's step, context and all, costs what the bare forward costs) and ``matmuls / kvlab``
(the share of kvlab's step that is matrix multiplies; the rest is what an engine adds),
and with custom ops ``custom / kvlab`` (below 1.0: the custom ops' step is faster) and
``matmuls / custom``.

    python -m kvlab.measure.decode_step --threads 1
    python -m kvlab.measure.decode_step --batch-sizes 32 64 --context 256
    python -m kvlab.measure.decode_step --batch-sizes 32 --threads 1 --by-part
    python -m kvlab.measure.decode_step --threads 1 --compile

``--compile`` adds ``compiled / kvlab`` (below 1.0: the compiled step is faster),
``matmuls / compiled``, and ``compile s``: the seconds the compiled runner's first step
took beyond kvlab's (the first batch size compiles; later ones reuse the graphs, whose
token dimension is dynamic, and show about 0).

``--by-part`` also splits kvlab's eager step at each batch size into the parts an engine does
besides its matrix multiplies, each timed alone on the step's own shapes in the same
interleaved rounds (``decode_step_parts``):

    matmuls       q|k|v, o, gate|up, down in every layer, and the LM head
    attention     the backend over every sequence's context, every layer
    K/V write     this step's keys and values into the cache, every layer
    metadata      ``begin_step``: slots and block tables for the step
    norms         the RMSNorms (two per layer and the final one)
    rotary        the rotary embedding's angles, and q and k rotated
    activation    SiLU(gate) * up
    residual      the two residual adds per layer
    rest          the step minus all of the above: embedding, views, Python between calls

A part timed alone runs with warm caches and no neighbours, so the parts are estimates and
``rest`` absorbs the difference. So each part is also timed inside real steps, the
functions the runner calls for it wrapped with a clock (``_parts_in_step``); there the
activation and the residual adds, not wrapped, are in ``rest`` with the views and Python.
The small parts cost more inside the step: each follows a multiply that has just streamed
a layer's weights through the caches, and the code and data of every torch call come back
from memory.
Where the custom ops build, the table ends with the custom ops' step timed inside the same
way, its three C calls wrapped too (each norm with the residual add before it, SiLU * up,
the rotary embedding).

Each table ends with the bytes the two largest parts read from memory: the matrix
multiplies read every weight once (about 540 MB for SmolLM2-135M in float32, whatever the
batch), attention reads every sequence's K/V (batch x context x 46 KB). Beside their
rates stands a plain pass (``sum``) over as many bytes as the weights: a rate this core
reads at. Attention does little arithmetic per byte, so its time is mostly reading; the
multiplies do more per byte as the batch grows, and become bound by arithmetic. The last
line gives the share the multiplies would have if everything but them and attention were
free: with attention as measured, and with attention reading at the plain pass's rate.

Every sequence holds ``--context`` tokens before the timed step, in blocks handed out a
block per sequence in turn (as a server's decoding sequences grow), so that a sequence's
blocks are scattered over the pool. Not handled: prefill
steps, mixed steps, GPUs (the timings do not synchronize a CUDA device).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import torch.nn.functional as F

from kvlab.attention import fastest_backend
from kvlab.cache.base import ForwardBatch
from kvlab.cache.paged import PagedKVCache
from kvlab.measure.engine_overhead import time_calls
from kvlab.memory import KVSpec
from kvlab.model import custom_ops
from kvlab.model import runner as runner_module
from kvlab.model.custom_ops import CustomOpsRunner
from kvlab.model.linear import FusedLinear
from kvlab.model.loading import load_model
from kvlab.model.runner import ModelRunner, apply_rotary, rms_norm

METHODS = ("kvlab", "kvlab sdpa", "kvlab row-major", "matmuls only", "bare forward")
CUSTOM_OPS, COMPILED = "kvlab custom ops", "kvlab compiled"
IN_STEP = ("matmuls", "attention", "K/V write", "metadata", "norms", "rotary", "rest")
# The custom ops' step, timed inside: each norm with the residual add before it; SiLU * up.
CUSTOM_IN_STEP = ("matmuls", "attention", "K/V write", "metadata", "norms and adds",
                  "activation", "rotary", "rest")  # fmt: skip
PARTS = ("matmuls", "attention", "K/V write", "metadata", "norms", "rotary", "activation",
         "residual")  # fmt: skip


def decode_step_times(
    model,
    batch_size: int,
    context: int,
    rounds: int = 12,
    block_size: int = 16,
    compiled: bool = False,
) -> dict[str, float]:
    """Median seconds of one decode step of ``batch_size`` sequences, by method: ``METHODS``,
    ``CUSTOM_OPS`` where the custom ops build; with ``compiled``, also ``COMPILED`` and
    "compile": how much longer the compiled runner's first forward (a prefill of
    ``context`` tokens per sequence) took than kvlab's, the compile where no earlier runner
    in this process compiled these graphs."""
    backend = fastest_backend(model.device)
    runners = {
        "kvlab": ModelRunner(model, attention=backend),
        "kvlab sdpa": ModelRunner(model, attention="sdpa"),
        "kvlab row-major": ModelRunner(model, attention="sdpa", onednn=False),
    }
    if custom_ops.benchmark_default(model.device):
        runners[CUSTOM_OPS] = CustomOpsRunner(model, attention=backend)
    if compiled:
        from kvlab.model.compiled import CompiledRunner  # registers a torch op when imported

        runners[COMPILED] = CompiledRunner(model, attention=backend)
    methods = METHODS + tuple(name for name in (CUSTOM_OPS, COMPILED) if name in runners)
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    caches, first_step = {}, {}
    for name, runner in runners.items():
        start = time.perf_counter()
        caches[name] = _filled_cache(runner, batch_size, context, block_size, generator)
        first_step[name] = time.perf_counter() - start
    batch = ForwardBatch.build(
        list(range(batch_size)), [context] * batch_size, [1] * batch_size
    )  # the step's new token: position `context` of every sequence
    input_ids = torch.randint(vocab, (batch_size,), generator=generator)

    @torch.inference_mode()
    def bare() -> None:
        hidden = model.model(input_ids=input_ids[:, None], use_cache=False).last_hidden_state
        model.lm_head(hidden[:, -1])

    steps = {
        name: _step(runner, input_ids, batch, caches[name]) for name, runner in runners.items()
    }
    steps["matmuls only"] = _matmuls(runners["kvlab"], batch_size, generator)
    steps["bare forward"] = bare
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    for step in steps.values():
        step()  # warm up
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        # A new order each round: what runs just before a step (a transformers forward
        # over other weights, say) changes what its caches hold.
        order = list(methods)
        shuffle(order)
        for name in order:
            start = time.perf_counter()
            steps[name]()
            seconds[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(times) for name, times in seconds.items()}
    if compiled:
        medians["compile"] = first_step[COMPILED] - first_step["kvlab"]
    return medians


def decode_step_parts(
    model, batch_size: int, context: int, rounds: int = 12, block_size: int = 16
) -> dict[str, float]:
    """Median seconds of kvlab's decode step ("step") and of each of its ``PARTS`` timed
    alone on the step's shapes, "rest": the step minus the parts, and "plain read": one
    ``sum`` over a tensor as large as the weights (a rate this core can read at); then each
    ``IN_STEP`` part inside real steps ("<part> in step") and, where the custom ops build,
    each ``CUSTOM_IN_STEP`` part inside the custom ops' steps ("<part> in custom", and
    "step in custom")."""
    runner = ModelRunner(model, attention=fastest_backend(model.device))
    config, generator = runner.config, torch.Generator().manual_seed(0)
    cache = _filled_cache(runner, batch_size, context, block_size, generator)
    batch = ForwardBatch.build(list(range(batch_size)), [context] * batch_size, [1] * batch_size)
    input_ids = torch.randint(config.vocab_size, (batch_size,), generator=generator)
    heads, kv_heads, head_dim = runner.num_heads, runner.num_kv_heads, runner.head_dim
    hidden = torch.randn(batch_size, config.hidden_size, generator=generator)
    gate, up = torch.randn(2, batch_size, config.intermediate_size, generator=generator)
    qk = torch.randn(batch_size, heads + kv_heads, head_dim, generator=generator)
    q = qk[:, :heads].contiguous()
    k, v = torch.randn(2, batch_size, kv_heads, head_dim, generator=generator)
    layers = list(zip(model.model.layers, range(config.num_hidden_layers), strict=True))
    meta = cache.begin_step(batch)

    def attention() -> None:
        for _, index in layers:
            runner.attention(q, index, meta, cache, runner.scale)

    def kv_write() -> None:
        for _, index in layers:
            cache.write(index, meta, k, v)

    def norms() -> None:
        for layer, _ in layers:
            rms_norm(hidden, layer.input_layernorm.weight, runner.eps)
            rms_norm(hidden, layer.post_attention_layernorm.weight, runner.eps)
        rms_norm(hidden, model.model.norm.weight, runner.eps)

    def rotary() -> None:
        cos, sin = runner.rotary(batch.positions)
        for _ in layers:
            apply_rotary(qk, cos, sin)

    def activation() -> None:
        for _ in layers:
            F.silu(gate) * up

    def residual() -> None:
        for _ in layers:
            hidden + hidden
            hidden + hidden

    parts = {
        "matmuls": _matmuls(runner, batch_size, generator),
        "attention": attention,
        "K/V write": kv_write,
        "metadata": lambda: cache.begin_step(batch),
        "norms": norms,
        "rotary": rotary,
        "activation": activation,
        "residual": residual,
    }
    # A plain pass over as many bytes as the weights: what one read of them costs here.
    plain = torch.ones(bytes_read(model, 1, 0)["weights"] // 4)
    timed = {"step": _step(runner, input_ids, batch, cache), **parts, "plain read": plain.sum}
    seconds: dict[str, list[float]] = {name: [] for name in timed}
    with torch.inference_mode():
        for run in timed.values():
            run()  # warm up
        for _ in range(rounds):
            for name, run in timed.items():
                start = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - start)
        in_step = [_parts_in_step(runner, input_ids, batch, cache) for _ in range(rounds)]
        if custom_ops.benchmark_default(model.device):
            custom = CustomOpsRunner(model, attention=runner.attention)
            in_custom = [_parts_in_step(custom, input_ids, batch, cache) for _ in range(rounds)]
    medians = {name: statistics.median(times) for name, times in seconds.items()}
    medians["rest"] = medians["step"] - sum(medians[name] for name in PARTS)
    for name in IN_STEP:
        medians[f"{name} in step"] = statistics.median(spent[name] for spent in in_step)
    if custom_ops.benchmark_default(model.device):
        for name in (*CUSTOM_IN_STEP, "step"):
            medians[f"{name} in custom"] = statistics.median(spent[name] for spent in in_custom)
    return medians


def _parts_in_step(runner, input_ids, batch, cache) -> dict[str, float]:
    """Seconds each of the ``IN_STEP`` parts (``CUSTOM_IN_STEP`` for a ``CustomOpsRunner``)
    spends inside one real step: the functions the runner calls for them are wrapped with a
    clock for that step ("rest" is the step's time outside them; "step", all of it)."""
    wrapped = [  # (owner, attribute, part): the runner's module, class or object
        (FusedLinear, "__call__", "matmuls"),
        (runner, "attention", "attention"),
        (cache, "write", "K/V write"),
        (cache, "begin_step", "metadata"),
        (runner, "rotary", "rotary"),
    ]
    if isinstance(runner, CustomOpsRunner):
        spent = dict.fromkeys(CUSTOM_IN_STEP, 0.0)
        wrapped += [
            (custom_ops, "fused_add_rms_norm", "norms and adds"),
            (custom_ops, "silu_and_mul", "activation"),
            (custom_ops, "rotary_embedding", "rotary"),
        ]
    else:
        spent = dict.fromkeys(IN_STEP, 0.0)
        wrapped += [(runner_module, "rms_norm", "norms"), (runner_module, "apply_rotary", "rotary")]
    # (owner, name, what it had: its own attribute, or None for a method of its class)
    originals = [(owner, name, vars(owner).get(name)) for owner, name, _ in wrapped]
    try:
        for owner, name, part in wrapped:
            time_calls(owner, name, spent, part)
        start = time.perf_counter()
        runner.forward(input_ids, batch, cache)
        step = time.perf_counter() - start
    finally:
        for owner, name, own in originals:
            if own is None:
                delattr(owner, name)
            else:
                setattr(owner, name, own)
    spent["rest"] = step - sum(spent.values())
    spent["step"] = step
    return spent


def bytes_read(model, batch_size: int, context: int) -> dict[str, int]:
    """The bytes a decode step must read from memory: "weights", every matrix the step
    multiplies by (the LM head included), and "K/V", every sequence's cached keys and values
    over ``context`` tokens and the new one, in every layer."""
    layer, config = model.model.layers[0], model.config
    per_layer = sum(
        linear.weight.numel()
        for linear in (
            *(getattr(layer.self_attn, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj")),
            *(getattr(layer.mlp, name) for name in ("gate_proj", "up_proj", "down_proj")),
        )
    )
    head = model.lm_head.weight
    weights = (per_layer * config.num_hidden_layers + head.numel()) * head.element_size()
    kv_per_token = KVSpec.from_config(config, dtype=head.dtype).bytes_per_token
    return {"weights": weights, "K/V": batch_size * (context + 1) * kv_per_token}


def format_parts(batch_size: int, medians: dict[str, float], read: dict[str, int]) -> str:
    """One table: each part's milliseconds and its share of the step; then the bytes the
    multiplies and attention read (``bytes_read``) and their rates beside a plain pass's,
    and what ``matmuls / step`` could be with everything but the two free, at attention's
    measured speed and at the plain pass's rate."""
    step = medians["step"]
    inside = "matmuls in step" in medians
    columns = f"  {'':<12}{'timed alone':>16}" + (f"{'in the step':>18}" if inside else "")
    lines = [f"batch {batch_size}: kvlab's step {1e3 * step:.1f} ms, by part", columns]
    for name in (*PARTS, "rest"):
        row = f"  {name:<12}{1e3 * medians[name]:>9.1f} ms{medians[name] / step:>5.0%}"
        if f"{name} in step" in medians:
            spent = medians[f"{name} in step"]
            row += f"{1e3 * spent:>11.1f} ms{spent / step:>5.0%}"
        lines.append(row)
    weights, kv, matmuls = read["weights"], read["K/V"], medians["matmuls"]
    plain = weights / medians["plain read"]
    weight_rate, kv_rate = weights / matmuls, kv / medians["attention"]
    lines.append(
        f"  read: weights {weights / 1e6:.0f} MB by the matmuls ({weight_rate / 1e9:.1f} GB/s),"
        f" K/V {kv / 1e6:.0f} MB by attention ({kv_rate / 1e9:.1f} GB/s);"
        f" a plain pass reads {plain / 1e9:.1f} GB/s"
    )
    lines.append(
        f"  matmuls / step: {matmuls / step:.2f}; with all but the matmuls and attention free:"
        f" {matmuls / (matmuls + medians['attention']):.2f}, and"
        f" {matmuls / (matmuls + kv / plain):.2f} if attention read at the plain pass's rate"
    )
    if "step in custom" in medians:
        custom = medians["step in custom"]
        shares = ", ".join(
            f"{name} {medians[f'{name} in custom'] / custom:.0%}" for name in CUSTOM_IN_STEP
        )
        lines.append(f"  the custom ops' step {1e3 * custom:.1f} ms, timed inside: {shares}")
    return "\n".join(lines)


def _filled_cache(runner, batch_size, context, block_size, generator) -> PagedKVCache:
    """A paged cache holding ``context`` prompt tokens of each sequence, with room for one more."""
    num_blocks = batch_size * (-(-(context + 1) // block_size))
    cache = PagedKVCache.from_spec(runner.kv_spec(), num_blocks, block_size=block_size)
    prompt = torch.randint(runner.config.vocab_size, (batch_size * context,), generator=generator)
    # Blocks handed out a block per sequence in turn, as decoding sequences grow in a
    # server: each sequence's blocks lie batch_size blocks apart in the pool, not side by side.
    for start in range(0, context, block_size):
        for seq_id in range(batch_size):
            cache.allocate_slots(seq_id, min(block_size, context - start))
    prefill = ForwardBatch.build(list(range(batch_size)), [0] * batch_size, [context] * batch_size)
    runner.forward(prompt, prefill, cache)
    for seq_id in range(batch_size):
        cache.allocate_slots(seq_id, 1)
    return cache


def _step(runner, input_ids, batch, cache):
    def step() -> None:
        runner.forward(input_ids, batch, cache)  # writes the same slot again each round

    return step


def _matmuls(runner, batch_size, generator):
    """The step's matrix multiplies alone, on random rows of the shapes they get."""
    config = runner.config
    hidden = torch.randn(batch_size, config.hidden_size, generator=generator)
    inner = torch.randn(batch_size, config.intermediate_size, generator=generator)

    @torch.inference_mode()
    def matmuls() -> None:
        for layer in runner.weights.layers:
            layer.qkv_proj(hidden)
            layer.o_proj(hidden)
            layer.gate_up_proj(hidden)
            layer.down_proj(inner)
        runner.weights.lm_head(hidden)

    return matmuls


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m kvlab.measure.decode_step", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--context", type=int, default=128, help="tokens each sequence holds")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument(
        "--by-part", action="store_true", help="also split kvlab's step into its parts"
    )
    parser.add_argument(
        "--compile", action="store_true", help="also time the torch.compile'd runner"
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = load_model(args.model, device="cpu")
    print(f"{args.model}, float32, {torch.get_num_threads()} threads, {args.context} tokens of "
          f"context per sequence; ms per decode step, median of {args.rounds} rounds")  # fmt: skip
    print(f"kvlab's attention backend: {fastest_backend(model.device)}")
    methods = METHODS + ((CUSTOM_OPS,) if custom_ops.benchmark_default(model.device) else ())
    methods += (COMPILED,) if args.compile else ()
    ratios = ["bare / kvlab", "matmuls / kvlab"]
    for name, short in ((CUSTOM_OPS, "custom"), (COMPILED, "compiled")):
        ratios += [f"{short} / kvlab", f"matmuls / {short}"] if name in methods else []
    ratios += ["compile s"] if args.compile else []
    width = 19 if args.compile else 17  # the ratios' names are longer than the methods'
    print(f"{'batch':>5}" + "".join(f"{name:>{width}}" for name in methods + tuple(ratios)))
    for batch_size in args.batch_sizes:
        times = decode_step_times(
            model, batch_size, args.context, args.rounds, compiled=args.compile
        )
        kvlab, matmuls = times["kvlab"], times["matmuls only"]
        shares = [times["bare forward"] / kvlab, matmuls / kvlab]
        for name in (CUSTOM_OPS, COMPILED):
            shares += [times[name] / kvlab, matmuls / times[name]] if name in methods else []
        row = "".join(f"{times[name] * 1e3:>{width}.1f}" for name in methods)
        row += "".join(f"{share:>{width}.2f}" for share in shares)
        row += f"{times['compile']:>{width}.1f}" if args.compile else ""
        print(f"{batch_size:>5}{row}")
    if args.by_part:
        for batch_size in args.batch_sizes:
            parts = decode_step_parts(model, batch_size, args.context, args.rounds)
            print(format_parts(batch_size, parts, bytes_read(model, batch_size, args.context)))


if __name__ == "__main__":
    main()
