"""Builds (on first use) and loads the fused CPU kernel, ``kernels/csrc/edge_attention.cpp`` (and
the Converter's linear scan, ``kernels/csrc/linear_scan.cpp``).

The extension is compiled by :func:`torch.utils.cpp_extension.load` with ``-O3 -march=native -fopenmp`` into
torch's extension cache (``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``); the
name carries a hash of the source, the torch version and the CPU's instruction-set flags, so an edit,
a torch upgrade or a different CPU rebuilds instead of loading a stale or illegal binary. Later
processes load the cached library in milliseconds. The operators are registered as
``torch.ops.graphattn_fused.*``.

If the build fails (no C++ compiler, no ``ninja``), :func:`cpu_ops` returns ``None`` and warns once;
callers then use the pure-torch reference. ``GRAPHATTN_NO_CPU_EXTENSION=1`` disables the extension.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import sysconfig
import threading
import warnings
from pathlib import Path
from typing import Any

import torch

SOURCE = Path(__file__).resolve().parent / "csrc" / "edge_attention.cpp"
#: every translation unit of the extension (the linear scan of the Converter's shift operator too)
SOURCES = (SOURCE, SOURCE.parent / "edge_attention_blocked.cpp", SOURCE.parent / "linear_scan.cpp")
#: headers the sources include (part of the build's hash)
HEADERS = (SOURCE.parent / "common.h",)
# ``-fopenmp`` is needed for ``at::parallel_for`` itself: ATen's OpenMP backend is an inline
# ``#pragma omp parallel`` in the headers, which compiles to a serial loop without it. The binary
# links ``libgomp.so.1``, the soname torch already loaded, so one OpenMP runtime serves both.
CFLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-std=c++17"]
LDFLAGS = ["-fopenmp"]

_lock = threading.Lock()
_state: dict[str, Any] = {"ops": None, "error": None, "tried": False, "warned": False}


def _cpu_signature() -> str:
    """The CPU's instruction-set flags (``-march=native`` binaries are only valid on alike CPUs)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.machine() + platform.processor()


def extension_name() -> str:
    """Name of the build: a hash of the source, the flags, torch's version and the CPU."""
    h = hashlib.sha256()
    for src in SOURCES + HEADERS:
        h.update(src.read_bytes())
    h.update(" ".join(CFLAGS + LDFLAGS).encode())
    h.update(torch.__version__.encode())
    h.update(_cpu_signature().encode())
    return f"graphattn_fused_{h.hexdigest()[:12]}"


def _ensure_ninja_on_path() -> None:
    """``torch.utils.cpp_extension`` runs ``ninja`` from ``PATH``; add the environment's bin folder
    (where ``pip install ninja`` puts it) when the interpreter was started without activation."""
    if shutil.which("ninja") is not None:
        return
    candidates = [sysconfig.get_path("scripts"), str(Path(sys.executable).parent)]
    try:
        import ninja  # type: ignore[import-not-found]

        candidates.insert(0, ninja.BIN_DIR)
    except (ImportError, AttributeError):
        pass
    for folder in candidates:
        if folder and (Path(folder) / "ninja").exists():
            os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")
            return


def _build() -> None:
    from torch.utils.cpp_extension import load

    _ensure_ninja_on_path()
    load(
        name=extension_name(),
        sources=[str(src) for src in SOURCES],
        extra_cflags=CFLAGS,
        extra_ldflags=LDFLAGS,
        is_python_module=False,
        verbose=os.environ.get("GRAPHATTN_VERBOSE_BUILD") == "1",
    )


def cpu_ops(*, warn: bool = True) -> Any | None:
    """``torch.ops.graphattn_fused`` (building it on first use), or ``None`` if it cannot be built."""
    if _state["tried"] and (_state["ops"] is not None or not warn or _state.get("warned")):
        return _state["ops"]
    with _lock:
        if not _state["tried"]:
            if os.environ.get("GRAPHATTN_NO_CPU_EXTENSION") == "1":
                _state["error"] = "disabled by GRAPHATTN_NO_CPU_EXTENSION=1"
            else:
                try:
                    _build()
                    _state["ops"] = torch.ops.graphattn_fused
                except Exception as exc:  # no compiler, no ninja, a failed build: fall back
                    _state["error"] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[-1]}"
            _state["tried"] = True
        if _state["ops"] is None and warn and not _state.get("warned"):
            _state["warned"] = True
            warnings.warn(
                f"graphattn: the fused CPU kernel is unavailable ({_state['error']}); "
                "EdgeAttention uses the torch reference path",
                RuntimeWarning,
                stacklevel=3,
            )
    return _state["ops"]


def cpu_extension_error() -> str | None:
    """Why the extension is unavailable (``None`` if it loaded or was not tried yet)."""
    return _state["error"]
