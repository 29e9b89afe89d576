"""kvlab's C files, built by the machine's C compiler on first use and called through ctypes.

Two of kvlab's CPU paths are small C files with no dependency on torch's headers: the
paged decode attention kernel (``kvlab/attention/paged_decode_cpu.c``) and the model's
element-wise work between the matrix multiplies (``kvlab/model/custom_ops.c``). A C file
builds in well under a second, so each is built the first time it is needed. Its library
is kept in ``~/.cache/kvlab/native`` (``kvlab.env.cache_dir``), named after the source,
the compiler, the flags and this CPU's features (``-march=native`` code must not run on
another CPU). Callers pass the tensors' data pointers: no copies.

Compiled with ``-ffast-math`` (vector ``expf``, sums reordered as SIMD does) but linked
without it: GCC links a ``-ffast-math`` shared library with start-up code that makes the
whole process flush tiny floats to zero, torch included (``tests/test_native.py`` checks
that loading leaves torch's floats alone).

Threads: the C files parallelize with OpenMP, as many threads as
``torch.get_num_threads()``. Built by GCC they link ``libgomp.so.1``, which torch's Linux
wheels have already loaded, so both share one OpenMP runtime.

Not handled: compilers other than a ``cc``/``gcc``/``clang`` that takes GCC's flags (an
Apple clang without OpenMP builds a one-thread library), Windows.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from kvlab.env import cache_dir

COMPILE_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fPIC"]
LINK_FLAGS = ["-shared"]


class KernelUnavailable(RuntimeError):
    """A C file cannot be built here; the message says why and what to use instead."""


class NativeLibrary:
    """One C file of kvlab's: built on first use, loaded once; a failed build is not retried.

    Args:
        source: the C file.
        declare: sets the ``argtypes`` and ``restype`` of the library's functions.
        option: the setting that asked for it, for messages (``"attention_backend='cpu'"``).
        instead: what to use where it cannot be built (``"attention_backend='sdpa'"``).
    """

    def __init__(
        self, source: Path, declare: Callable[[ctypes.CDLL], None], option: str, instead: str
    ):
        self.source, self.declare, self.option, self.instead = source, declare, option, instead
        self._loaded: ctypes.CDLL | KernelUnavailable | None = None  # or why it is not

    def load(self) -> ctypes.CDLL:
        """The library, built if needed.

        Raises:
            KernelUnavailable: no compiler, or the build failed; says what to use instead.
        """
        if self._loaded is None:
            try:
                library = ctypes.CDLL(str(self.build()))
                self.declare(library)
                self._loaded = library
            except KernelUnavailable as error:
                self._loaded = error
            except (OSError, subprocess.SubprocessError) as error:  # unwritable cache, bad $CC
                self._loaded = KernelUnavailable(
                    f"{self.source.name} cannot be built or loaded here: {error}; "
                    f"use {self.instead}"
                )
        if isinstance(self._loaded, KernelUnavailable):
            raise self._loaded
        return self._loaded

    def available(self) -> bool:
        """Whether the library is built, or can be, on this machine (builds it if needed)."""
        try:
            self.load()
        except KernelUnavailable:
            return False
        return True

    def build(self) -> Path:
        """The compiled library, built on first use: with OpenMP if the compiler has it.

        Compiled and linked in two steps, so that ``-ffast-math`` stays out of the link.
        """
        compiler = os.environ.get("CC") or next(
            (found for name in ("cc", "gcc", "clang") if (found := shutil.which(name))), None
        )
        if compiler is None:
            raise KernelUnavailable(
                f"{self.option} compiles a small C file on first use, and no C compiler "
                f"(cc, gcc or clang, or $CC) is on PATH. Install one (Debian: apt-get install "
                f"gcc) or use {self.instead}."
            )
        identity = self.source.read_bytes() + _compiler_version(compiler) + _cpu_features()
        directory = cache_dir() / "native"
        directory.mkdir(parents=True, exist_ok=True)
        targets = []
        for openmp in (["-fopenmp"], []):
            flags = [*COMPILE_FLAGS, *openmp, "|", *LINK_FLAGS, *openmp]
            key = hashlib.sha256(identity + " ".join(flags).encode()).hexdigest()[:16]
            targets.append((openmp, directory / f"{self.source.stem}-{key}.so"))
        for _, target in targets:
            if target.exists():
                return target
        errors = []
        for openmp, target in targets:
            # Built beside its final name, then renamed: two processes may build at once.
            with tempfile.TemporaryDirectory(dir=directory) as scratch:
                obj, built = Path(scratch) / "library.o", Path(scratch) / target.name
                steps = (
                    [compiler, *COMPILE_FLAGS, *openmp, "-c", str(self.source), "-o", str(obj)],
                    [compiler, *LINK_FLAGS, *openmp, str(obj), "-o", str(built), "-lm"],
                )
                for step in steps:
                    done = subprocess.run(step, capture_output=True, text=True, timeout=300)
                    if done.returncode != 0:
                        errors.append(done.stderr.strip())
                        break
                else:
                    os.replace(built, target)
                    return target
        raise KernelUnavailable(
            f"{compiler} could not build {self.source.name}:\n{errors[-1]}\nUse {self.instead}."
        )


def _compiler_version(compiler: str) -> bytes:
    done = subprocess.run([compiler, "--version"], capture_output=True, timeout=60)
    return done.stdout


def _cpu_features() -> bytes:
    """What ``-march=native`` depends on: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        # x86 names its CPU and features "model name" and "flags"; Arm "CPU part", "Features".
        keys = ("model name", "flags", "CPU implementer", "CPU part", "Features")
        wanted = sorted({line for line in lines if line.startswith(keys)})
        return "\n".join(wanted).encode()
    except OSError:
        return platform.processor().encode() + platform.machine().encode()
