"""The package's seams hold: who may import what, and who may ask a cache its class.

The scheduler plans with KV bookkeeping only (``kvlab.cache.manager``), never with a
tensor or a tensor cache; code outside ``kvlab/cache/`` talks to caches through their
interfaces and never branches on a cache's class.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import kvlab

PACKAGE = Path(kvlab.__file__).parent
CACHE_CLASSES = {
    "NaiveKVCache",
    "ContiguousKVCache",
    "PagedKVCache",
    "BlockManager",
    "ContiguousManager",
    "ContiguousArena",
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("name", ["scheduler", "swap_planner"])
def test_the_scheduler_imports_no_torch_and_no_tensor_cache(name):
    modules = imported_modules(PACKAGE / "engine" / f"{name}.py")
    assert not {m for m in modules if m == "torch" or m.startswith("torch.")}
    cache_modules = {m for m in modules if m.startswith("kvlab.cache")}
    assert cache_modules <= {"kvlab.cache.manager"}, cache_modules


BOOKKEEPING = (
    "manager",
    "block_pool",
    "prefix_cache",
    "block_manager",
    "contiguous_arena",
    "contiguous_manager",
)


def test_the_bookkeeping_imports_no_torch_and_nothing_but_bookkeeping():
    allowed = {f"kvlab.cache.{name}" for name in BOOKKEEPING}
    for name in BOOKKEEPING:
        modules = imported_modules(PACKAGE / "cache" / f"{name}.py")
        assert "torch" not in modules, name
        kvlab_modules = {m for m in modules if m.startswith("kvlab.")}
        assert kvlab_modules <= allowed, (name, kvlab_modules - allowed)


def test_nothing_outside_the_cache_package_asks_a_cache_its_class():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "cache":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                if names & CACHE_CLASSES:
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not offenders, offenders


def readme_module_map() -> dict[str, int]:
    """``path -> line count`` as the README's module map lists them."""
    readme = (PACKAGE.parent / "README.md").read_text()
    listed, folder = {}, None
    for line in readme.splitlines():
        if re.fullmatch(r"(kvlab|kernels)(/\w+)?/", line):
            folder = line
        elif folder and (match := re.match(r"  (\S+\.py) +(\d+)  \S", line)):
            listed[folder + match.group(1)] = int(match.group(2))
        elif not line.startswith("  "):
            folder = None
    return listed


def test_the_readmes_module_map_lists_every_module_at_about_its_size():
    root = PACKAGE.parent
    modules = {
        str(p.relative_to(root)): len(p.read_text().splitlines())
        for folder in (PACKAGE, root / "kernels")
        for p in folder.rglob("*.py")
    }
    listed = readme_module_map()
    assert sorted(listed) == sorted(modules), "the README's module map and the tree differ"
    # Counts may lag a little behind edits; a map that is off by more misleads a reader.
    off = {
        path: (listed[path], n)
        for path, n in modules.items()
        if abs(listed[path] - n) > max(10, n // 10)
    }
    assert not off, f"README line counts (listed, actual) to refresh: {off}"


# A model's forward pass is called by the serving loop, and by nothing else that steps
# requests: a second loop is a second truth about admission, preemption and timing.
FORWARD_CALLERS = {
    "engine/llm_engine.py": "LLMEngine.step: the one serving loop",
    "model/greedy.py": "greedy_generate: lab 01's naive loop, the oracle the engine is held to",
    "measure/serve.py": "greedy_step: one hand-driven step with no scheduling (lab 03's fork)",
    "measure/decode_step.py": "a benchmark that times one decode step",
}


def test_only_the_engine_steps_requests_through_a_model():
    callers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "forward"
            ):
                callers.add(str(path.relative_to(PACKAGE)))
    assert callers == set(FORWARD_CALLERS), sorted(callers)


def test_every_name_is_imported_from_the_module_that_defines_it():
    """One import path per name: ``from kvlab.x import Name`` only where ``x`` defines it
    (or is a package that re-exports it on purpose), so a reader follows an import to the
    code. Checked for the engine's and the cache's modules."""
    defined: dict[str, set[str]] = {}
    for folder in ("engine", "cache"):
        for path in (PACKAGE / folder).glob("*.py"):
            if path.name == "__init__.py":
                continue
            tree = ast.parse(path.read_text())
            names = set()
            for node in tree.body:
                if isinstance(node, ast.ClassDef | ast.FunctionDef):
                    names.add(node.name)
                elif isinstance(node, ast.Assign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names |= {t.id for t in targets if isinstance(t, ast.Name)}
            defined[f"kvlab.{folder}.{path.stem}"] = names
    wrong = []
    for path in [*PACKAGE.rglob("*.py"), *Path(__file__).parent.glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in defined:
                for alias in node.names:
                    if alias.name[0].isupper() and alias.name not in defined[node.module]:
                        wrong.append(f"{path.name}: {alias.name} from {node.module}")
    assert not wrong, wrong


def test_the_block_pool_interface_declares_what_the_manager_reads():
    """``BlockPoolInterface`` is the pool a learner may plug in (``LLM(block_pool=...)``):
    it declares exactly the members the block manager and the page map use, and kvlab's
    pool and the learner's adapter have every one."""
    from kvlab.cache.block_pool import BlockPool, BlockPoolInterface
    from kvlab.exercises.learner_pool import LearnerPool

    used = set()
    for module in ("block_manager", "paged"):
        source = (PACKAGE / "cache" / f"{module}.py").read_text()
        used |= set(re.findall(r"\bpool\.(\w+)", source))
    declared = {
        name
        for name in vars(BlockPoolInterface)
        if not name.startswith("_") and name not in vars(object)
    } | set(BlockPoolInterface.__annotations__)
    assert used == declared
    learner = SimpleNamespace(ref_cnt=[0] * 4, block_hash=[None] * 4, free_queue=[0, 1, 2, 3])
    for pool in (BlockPool(4), LearnerPool(learner)):
        missing = {name for name in declared if not hasattr(pool, name)}
        assert not missing, (type(pool).__name__, missing)
    # The prefix cache owns its hash map and needs no pool: no import cycle.
    assert "kvlab.cache.block_pool" not in imported_modules(PACKAGE / "cache" / "prefix_cache.py")


def files_to_attention(prompt_len: int) -> list[str]:
    """The kvlab files a reader opens to follow the first decode step of one request, from
    ``LLM.generate``'s loop to the first layer's attention call, in order of first entry.

    Counted: every kvlab file in which the step runs a Python function. Not counted: what
    the step does after that call (the other layers, sampling, outputs), code the tracer
    cannot see (C calls, dataclass ``__init__``s). The prompt has ``prompt_len`` tokens in
    blocks of 4; the request is greedy and runs alone.
    """
    from kvlab import LLM, SamplingParams, load_model

    model, _ = load_model("tiny", device="cpu")
    llm = LLM(model, num_blocks=32, block_size=4)
    files: list[str] = []
    steps = []

    def tracer(frame, event, arg):
        path = Path(frame.f_code.co_filename)
        if event == "call" and PACKAGE in path.parents and files[-1] != "attention call":
            name = str(path.relative_to(PACKAGE))
            if name not in files:
                files.append(name)
            if path.parent.name == "attention":
                files.append("attention call")

    engine_step = llm.engine.step

    def traced_step():
        steps.append(None)
        if len(steps) != 2:  # step 1 is the prefill
            return engine_step()
        files.append(str(Path(sys._getframe(1).f_code.co_filename).relative_to(PACKAGE)))
        previous = sys.gettrace()
        sys.settrace(tracer)
        try:
            return engine_step()
        finally:
            sys.settrace(previous)
            work = llm.engine.last_step_work
            assert (work.num_prefill_tokens, work.num_decode_seqs) == (0, 1), work

    llm.engine.step = traced_step
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    llm.generate([list(range(5, 5 + prompt_len))], params, use_tqdm=False)
    assert files[-1] == "attention call", files
    return files[:-1]


def test_a_decode_step_reaches_attention_through_at_most_nine_files():
    """Following a decode step takes the loop, the step, the clock, the scheduler, the
    block manager, the cache's step interface, the runner, its multiplies and attention.
    Nine files is a reading aid (the README lists them), not a size target for any file."""
    # The new token leaves room in its block (positions 0-5 held, token 6 in blocks of 4).
    files = files_to_attention(prompt_len=6)
    assert len(files) <= 9, files
    assert files[0] == "engine/llm.py" and files[-1].startswith("attention/"), files
    # The new token opens a block (prompt 4), or fills one (prompt 3): the pool hands out
    # or caches the block, and the prefix cache hashes a block just filled. Those two
    # files, and no more.
    for prompt_len in (3, 4):
        more = set(files_to_attention(prompt_len)) - set(files)
        assert more == {"cache/block_pool.py", "cache/prefix_cache.py"}, (prompt_len, more)
