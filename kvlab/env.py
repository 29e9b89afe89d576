"""Where kvlab runs: the device it picks and a one-call report of the environment.

kvlab uses CUDA by itself when a CUDA device exists and the CPU otherwise; nothing in the
labs asks the learner to choose. Triton kernels run natively on CUDA and through Triton's
interpreter (``TRITON_INTERPRET=1``, numpy on the CPU) everywhere else: correct, but slow,
so interpreter timings say nothing about speed.

Not handled: Apple MPS and other accelerators (kvlab treats them as CPU machines).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

# NOTE: Triton reads TRITON_INTERPRET when it is first imported, and `import transformers`
# imports it (through torch._dynamo). Without CUDA the kernels can only run interpreted, so
# the switch is set here, the first module kvlab imports, unless the user chose a value.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def cache_dir() -> Path:
    """Where kvlab keeps what it makes once (converted checkpoints, built kernels):
    ``$KVLAB_CACHE``, else ``~/.cache/kvlab``."""
    root = os.environ.get("KVLAB_CACHE") or (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvlab"
    )
    return Path(root)


def default_device() -> torch.device:
    """The device kvlab computes on: the first CUDA device if there is one, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a ``torch.device``, or ``default_device()`` for None.

    Raises:
        ValueError: a device kvlab does not run on (it knows "cpu" and "cuda"), or CUDA
            asked for on a machine without it.
    """
    if device is None:
        return default_device()
    allowed = "use 'cpu', 'cuda' (or 'cuda:N'), or None for CUDA when present, else the CPU"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device={device!r} is not allowed: {allowed}") from error
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not allowed: {allowed}")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r} is not allowed: this machine has no CUDA device; use 'cpu' or None"
        )
    return resolved


def triton_mode() -> str:
    """How Triton kernels will run here: "native", "interpreter" or "unavailable".

    "interpreter" means ``TRITON_INTERPRET=1`` (set by ``kvlab.kernels`` when no CUDA
    device exists, or by the user).
    """
    if _version("triton") is None:
        return "unavailable"
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return "interpreter"
    return "native"


@dataclass(frozen=True)
class EnvReport:
    """What kvlab found: device, its memory, library versions and the Triton mode."""

    device: str
    device_name: str
    device_memory_bytes: int | None
    python: str
    torch: str
    transformers: str | None
    triton: str | None
    triton_mode: str

    def __str__(self) -> str:
        memory = (
            f"{self.device_memory_bytes / 2**30:.1f} GiB"
            if self.device_memory_bytes is not None
            else "n/a (CPU: KV lives in host RAM)"
        )
        rows = [
            ("device", f"{self.device} ({self.device_name})"),
            ("device memory", memory),
            ("python", self.python),
            ("torch", self.torch),
            ("transformers", self.transformers or "not installed"),
            ("triton", self.triton or "not installed"),
            ("triton kernels run", self.triton_mode),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def env_report() -> EnvReport:
    """Report the device kvlab will use, library versions and how Triton kernels run."""
    device = default_device()
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, memory = props.name, props.total_memory
    else:
        name, memory = platform.processor() or platform.machine(), None
    return EnvReport(
        device=device.type,
        device_name=name,
        device_memory_bytes=memory,
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=_version("transformers"),
        triton=_version("triton"),
        triton_mode=triton_mode(),
    )


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
