"""kvlab's C files build on first use (``kvlab.native``), and say what to do where they cannot."""

from __future__ import annotations

import pytest
import torch

from kvlab import native
from kvlab.attention import cpu_kernel
from kvlab.model import custom_ops

LIBRARIES = {"attention": cpu_kernel.LIBRARY, "custom ops": custom_ops.LIBRARY}


@pytest.mark.parametrize("name", LIBRARIES)
def test_loading_leaves_torchs_floats_alone(name):
    """-ffast-math at link time would make the process flush subnormal floats to zero."""
    if not LIBRARIES[name].available():
        pytest.skip("no C compiler could build it")
    assert (torch.tensor([1e-39]) * 1.0).item() != 0.0


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "attention",
            r"attention_backend='cpu' compiles .* no C compiler .* use attention_backend='sdpa'\.",
        ),
        ("custom ops", r"custom_ops=True compiles .* no C compiler .* use custom_ops=False\."),
    ],
)
def test_no_compiler_says_what_to_do(monkeypatch, tmp_path, name, message):
    monkeypatch.setattr(native.shutil, "which", lambda _: None)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("KVLAB_CACHE", str(tmp_path))
    known = LIBRARIES[name]  # a fresh copy: the real one may have loaded already
    library = native.NativeLibrary(known.source, known.declare, known.option, known.instead)
    with pytest.raises(native.KernelUnavailable, match=message):
        library.load()
    assert not library.available()  # the failure is kept, not retried


def test_a_failed_build_shows_the_compilers_error(monkeypatch, tmp_path):
    source = tmp_path / "broken.c"
    source.write_text("int f( {\n")
    monkeypatch.setenv("KVLAB_CACHE", str(tmp_path))
    if not any(native.shutil.which(name) for name in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler")
    library = native.NativeLibrary(source, lambda lib: None, "x=1", "x=0")
    with pytest.raises(
        native.KernelUnavailable, match=r"(?s)could not build broken.c:\n.*error: .*Use x=0\."
    ):
        library.load()


@pytest.mark.parametrize("name", LIBRARIES)
def test_an_installed_kvlab_ships_the_c_source(name):
    """A wheel carries only the files ``package-data`` names; a C file left out of it would
    fail to build on first use after ``pip install``."""
    import re
    from fnmatch import fnmatch
    from pathlib import Path

    import kvlab

    root = Path(kvlab.__file__).parent
    source = LIBRARIES[name].source
    package = ".".join(("kvlab", *source.parent.relative_to(root).parts))
    pyproject = (root.parent / "pyproject.toml").read_text()
    section = pyproject.split("[tool.setuptools.package-data]")[1].split("\n[")[0]
    listed = re.search(rf'^"{re.escape(package)}" = \[(.*)\]$', section, re.MULTILINE)
    patterns = re.findall(r'"([^"]+)"', listed.group(1)) if listed else []
    assert any(fnmatch(source.name, pattern) for pattern in patterns), (package, patterns)
