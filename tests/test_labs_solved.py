"""Each lab with its build-it solved: the rest of the lab works with a right learner's code.

The labs are committed with the build-it stubs in place (nbval runs them so). Here a lab
is executed end to end with the stub class replaced by a solution written as a learner
would (``tests/solutions/``), and the check must print that every criterion holds; cells
after it that use the learner's class must run too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
SOLVED = {
    # lab: (the stub class the solution replaces, solution file, what the lab must print)
    "04_batching.ipynb": (
        "MyScheduler",
        "lab04_scheduler.py",
        ["9 of 9 criteria hold", "the same tokens: True"],
    ),
}


def solution_class(path: Path, name: str) -> str:
    """The source of class ``name`` in a solution file."""
    source = path.read_text()
    node = next(n for n in ast.parse(source).body if getattr(n, "name", None) == name)
    return ast.get_source_segment(source, node)


def with_solution(notebook, name: str, solution: str) -> None:
    """Replace the stub ``class name`` at the top of its cell, keeping the rest."""
    cell = next(c for c in notebook.cells if c.source.startswith(f"class {name}("))
    stub = next(n for n in ast.parse(cell.source).body if getattr(n, "name", None) == name)
    lines = cell.source.splitlines()
    cell.source = "\n".join([solution, *lines[stub.end_lineno :]])


@pytest.mark.parametrize("lab", sorted(SOLVED))
def test_the_lab_runs_with_its_build_it_solved(lab):
    name, solution_file, expected = SOLVED[lab]
    notebook = nbformat.read(ROOT / "labs" / lab, as_version=4)
    with_solution(
        notebook, name, solution_class(ROOT / "tests" / "solutions" / solution_file, name)
    )
    NotebookClient(
        notebook, timeout=600, resources={"metadata": {"path": str(ROOT / "labs")}}
    ).execute()
    printed = "\n".join(
        output.get("text", "") + str(output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )
    errors = [
        o
        for c in notebook.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "error"
    ]
    assert not errors, errors[0]
    for text in expected:
        assert text in printed, text
