"""Each lab's build-it as a learner meets it after a restart: the set-up, then the build-it.

A learner who restarts the kernel and jumps to the build-it runs the lab's set-up cells
(tagged ``setup``) and then the build-it section's cells (tagged ``build-it``), nothing
else. Run that way, each build-it must work twice:

- as committed, with the stub in place: nothing raises (the check says what is missing);
- with the stub replaced by a solution written as a learner would (``tests/solutions/``):
  its check prints that every criterion holds, and the cells after it, some of which use
  the learner's code, run without an error.

nbval runs every lab top to bottom with the stubs; this is the other path through it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
SOLVED = {
    # lab: (the stub the solution replaces, solution file, what the lab must print)
    "02_contiguous.ipynb": ("MyArena", "lab02_arena.py", ["6 of 6 criteria hold"]),
    "03_paged.ipynb": ("MyBlockManager", "lab03_block_manager.py", ["9 of 9 criteria hold"]),
    "04_batching.ipynb": (
        "MyScheduler",
        "lab04_scheduler.py",
        ["9 of 9 criteria hold", "the same tokens: True"],
    ),
    "05_triton_paged_attention.ipynb": (
        "my_decode_kernel",
        "lab05_kernel.py",
        ["9 of 9 criteria hold"],
    ),
    "06_prefix_sharing.ipynb": ("MyBlockPool", "lab06_prefix_cache.py", ["7 of 7 criteria hold"]),
}


def definition_lines(source: str, name: str) -> tuple[int, int] | None:
    """The 1-based first and last lines of top-level class or def ``name``, decorators
    included, or None when ``source`` defines no such thing."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return first, node.end_lineno
    return None


def solution_source(path: Path, name: str) -> str:
    source = path.read_text()
    first, last = definition_lines(source, name)
    return "\n".join(source.splitlines()[first - 1 : last])


def with_solution(notebook, name: str, solution: str) -> None:
    """Replace the stub definition of ``name`` in its cell, keeping the rest of the cell."""
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        try:
            lines = definition_lines(cell.source, name)
        except SyntaxError:  # IPython magics
            continue
        if lines is not None:
            rows = cell.source.splitlines()
            cell.source = "\n".join([*rows[: lines[0] - 1], solution, *rows[lines[1] :]])
            return
    raise AssertionError(f"no cell defines {name}")


def after_a_restart(lab: str):
    """The lab's ``setup`` cells, then its ``build-it`` cells, in the lab's order."""
    notebook = nbformat.read(ROOT / "labs" / lab, as_version=4)
    tagged = {
        tag: [c for c in notebook.cells if tag in c.get("metadata", {}).get("tags", [])]
        for tag in ("setup", "build-it")
    }
    for tag, cells in tagged.items():
        assert cells, f"{lab}: no code cell is tagged {tag!r}"
    setup_last = max(notebook.cells.index(c) for c in tagged["setup"])
    build_first = min(notebook.cells.index(c) for c in tagged["build-it"])
    assert setup_last < build_first, f"{lab}: a set-up cell comes after the build-it begins"
    notebook.cells = tagged["setup"] + tagged["build-it"]
    return notebook


def run(notebook) -> str:
    """Execute ``notebook`` in labs/; fail on the first error; return everything printed."""
    client = NotebookClient(notebook, timeout=600, resources={"metadata": {"path": ROOT / "labs"}})
    client.execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, f"{errors[0].ename}: {errors[0].evalue}"
    return "\n".join(
        o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in outputs
    )


@pytest.mark.parametrize("lab", sorted(SOLVED))
def test_the_build_it_runs_after_a_restart_as_committed(lab):
    name = SOLVED[lab][0]
    printed = run(after_a_restart(lab))
    assert "criteria hold" in printed, f"{lab}: the check of {name} printed no verdict"


@pytest.mark.parametrize("lab", sorted(SOLVED))
def test_the_build_it_solved_runs_after_a_restart(lab):
    name, solution_file, expected = SOLVED[lab]
    notebook = after_a_restart(lab)
    with_solution(
        notebook, name, solution_source(ROOT / "tests" / "solutions" / solution_file, name)
    )
    printed = run(notebook)
    for text in expected:
        assert text in printed, text
