"""Builds (on first use) and loads the fused CPU kernel, ``kernels/csrc/edge_attention.cpp`` (and
the Converter's linear scan, ``kernels/csrc/linear_scan.cpp``).

The extension is compiled by :func:`torch.utils.cpp_extension.load` with ``-O3 -march=native -fopenmp``
into a build folder of its own, ``$TORCH_EXTENSIONS_DIR/graphattn/graphattn_fused_<hash>/``
(``TORCH_EXTENSIONS_DIR`` defaults to ``~/.cache/torch_extensions``). The hash, which is also the
extension's name, covers everything the build depends on: the sources and headers (content and
path), the compiler flags, the compiler, the CPU's instruction-set flags (``-march=native``
binaries only run on alike CPUs), torch's version and install path, and the Python environment
(``sys.prefix`` and the ABI tag). So an edit, a torch upgrade or another CPU rebuilds instead of
loading a stale or illegal binary, and two virtual environments (or two checkouts) never share
-- and rebuild for each other -- a folder whose ``build.ninja`` records the other's include paths.

Each environment builds once (about 40 s; one line on stderr says so when it starts and when it
ends); later processes find the finished build (a ``build_info.json`` written after a successful
build) and load the library in milliseconds, without running the compiler or ninja and silently.
Concurrent first uses are serialised by an ``fcntl.flock`` on ``graphattn.lock`` in the build
folder (the OS releases it when a process dies): one process builds, the others wait and load.
A build interrupted by a signal may leave torch's own lock file (``lock``) behind, on which every
later build would wait forever; it is removed under the flock (or, where flock is unavailable,
once it is older than :data:`STALE_LOCK_SECONDS`). The operators are registered as
``torch.ops.graphattn_fused.*``.

Environment variables:

``GRAPHATTN_NO_CPU_EXTENSION=1``
    Never build or load the extension; EdgeAttention uses the pure-torch reference path.
``GRAPHATTN_VERBOSE_BUILD=1``
    Show torch's and the compiler's output while building (passes ``verbose=True`` to
    :func:`torch.utils.cpp_extension.load`), e.g. to see why a build fails.

If the build fails (no C++ compiler, no ``ninja``), :func:`cpu_ops` returns ``None`` and warns once;
callers then use the pure-torch reference.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

SOURCE = Path(__file__).resolve().parent / "csrc" / "edge_attention.cpp"
#: every translation unit of the extension (the linear scan of the Converter's shift operator too)
SOURCES = (SOURCE, SOURCE.parent / "edge_attention_blocked.cpp", SOURCE.parent / "linear_scan.cpp",
           SOURCE.parent / "dropout.cpp", SOURCE.parent / "sbm_fastrg.cpp",
           SOURCE.parent / "segmented_sort.cpp", SOURCE.parent / "unique_first.cpp",
           SOURCE.parent / "sbm_gate.cpp")
#: headers the sources include (part of the build's hash, as is any other ``csrc/*.h``)
HEADERS = (SOURCE.parent / "common.h",)
# ``-fopenmp`` is needed for ``at::parallel_for`` itself: ATen's OpenMP backend is an inline
# ``#pragma omp parallel`` in the headers, which compiles to a serial loop without it. The binary
# links ``libgomp.so.1``, the soname torch already loaded, so one OpenMP runtime serves both.
# These lists are never handed to torch themselves: ``load`` appends to ``extra_ldflags`` in place.
CFLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-std=c++17"]
LDFLAGS = ["-fopenmp"]

#: where flock is unavailable, torch's ``lock`` file older than this is taken as left by a dead build
STALE_LOCK_SECONDS = 10 * 60
#: written into the build folder once a build succeeded (its presence means "load, don't build")
BUILD_INFO = "build_info.json"
#: our own lock (``fcntl.flock``) around a build; torch's FileBaton uses ``lock`` in the same folder
FLOCK_NAME = "graphattn.lock"
TORCH_LOCK_NAME = "lock"

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


def _compiler() -> str:
    """The C++ compiler torch will run (``$CXX`` or ``c++``), resolved, with its file's mtime."""
    cxx = os.environ.get("CXX", "c++")
    found = shutil.which(cxx)
    if found is None:
        return cxx
    real = os.path.realpath(found)
    try:
        return f"{cxx} -> {real} @{os.stat(real).st_mtime_ns}"
    except OSError:
        return f"{cxx} -> {real}"


def _environment() -> dict[str, str]:
    """What ties a build to this environment: torch (version, install path, build) and Python."""
    return {
        "torch_version": str(torch.__version__),
        "torch_git": str(getattr(torch.version, "git_version", "")),
        "torch_cuda": str(torch.version.cuda),
        "torch_hip": str(getattr(torch.version, "hip", None)),
        "torch_path": os.path.realpath(os.path.dirname(torch.__file__)),
        "python_prefix": os.path.realpath(sys.prefix),
        "python_include": str(sysconfig.get_paths().get("include", "")),
        "python_abi": f"{sys.implementation.cache_tag}{getattr(sys, 'abiflags', '')} "
        f"{sysconfig.get_config_var('SOABI')}",
        "compiler": _compiler(),
        "cpu": _cpu_signature(),
    }


def build_inputs() -> dict[str, Any]:
    """Everything the build depends on (from copies of the flag lists; nothing the build changes)."""
    h = hashlib.sha256()
    files = SOURCES + HEADERS + tuple(sorted(set(SOURCE.parent.glob("*.h")) - set(HEADERS)))
    for src in files:
        h.update(str(src).encode() + b"\0")
        h.update(src.read_bytes() + b"\0")
    return {
        "sources": h.hexdigest(),
        "cflags": list(CFLAGS),
        "ldflags": list(LDFLAGS),
        **_environment(),
    }


def _key(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def extension_name() -> str:
    """Name of the build: a hash of :func:`build_inputs` (stable across calls and builds)."""
    return f"graphattn_fused_{_key(build_inputs())}"


def extensions_root() -> Path:
    """``$TORCH_EXTENSIONS_DIR`` or torch's default (``~/.cache/torch_extensions``)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        try:
            import torch._appdirs

            root = torch._appdirs.user_cache_dir(appname="torch_extensions")
        except Exception:
            root = os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
    return Path(os.path.realpath(root))


def build_directory(name: str | None = None) -> Path:
    """This environment's build folder, ``<extensions_root>/graphattn/<extension_name>``."""
    return extensions_root() / "graphattn" / (name or extension_name())


def _library_path(directory: Path, name: str) -> Path:
    return directory / f"{name}{'.pyd' if sys.platform == 'win32' else '.so'}"


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


def _log(message: str) -> None:
    print(f"graphattn: {message}", file=sys.stderr, flush=True)


def _load_library(path: Path) -> None:
    torch.ops.load_library(str(path))


def _is_built(directory: Path, name: str) -> bool:
    return (directory / BUILD_INFO).is_file() and _library_path(directory, name).is_file()


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[bool]:
    """Hold ``fcntl.flock`` on ``graphattn.lock`` (blocking; says so when another process builds).

    Yields whether the flock is held (``False`` where flock is unavailable, e.g. not POSIX)."""
    if fcntl is None:
        yield False
        return
    try:
        fd = os.open(directory / FLOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"waiting for another process building the fused CPU kernel in {directory} ...")
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without flock
            yield False
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        yield True
    finally:
        os.close(fd)  # releases the flock


def _remove_stale_torch_lock(directory: Path, have_flock: bool) -> bool:
    """Remove torch's FileBaton ``lock`` left by a killed build (``load`` would wait on it forever).

    Under our flock no other graphattn build of this folder is alive, so any ``lock`` is stale;
    without it, only one older than :data:`STALE_LOCK_SECONDS` is. Returns whether one was removed."""
    path = directory / TORCH_LOCK_NAME
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return False
    if not have_flock and age < STALE_LOCK_SECONDS:
        return False
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


def _build() -> None:
    """Load this environment's build of the extension, building it first if there is none."""
    inputs = build_inputs()
    name = f"graphattn_fused_{_key(inputs)}"
    directory = build_directory(name)
    if _is_built(directory, name):
        try:
            _load_library(_library_path(directory, name))
            return
        except Exception:  # a damaged build: rebuild it below
            with contextlib.suppress(OSError):
                (directory / BUILD_INFO).unlink()
    directory.mkdir(parents=True, exist_ok=True)
    with _build_lock(directory) as have_flock:
        if _is_built(directory, name):  # another process built it while this one waited
            _load_library(_library_path(directory, name))
            return
        _remove_stale_torch_lock(directory, have_flock)
        with contextlib.suppress(FileNotFoundError):  # possibly half-linked by a killed build
            _library_path(directory, name).unlink()
        from torch.utils.cpp_extension import load

        _ensure_ninja_on_path()
        verbose = os.environ.get("GRAPHATTN_VERBOSE_BUILD") == "1"
        _log(f"building the fused CPU kernel for this environment (once; 40 s to a few minutes, "
             f"longer on a busy machine) in {directory} ...")
        start = time.perf_counter()
        try:
            load(
                name=name,
                sources=[str(src) for src in SOURCES],
                extra_cflags=list(CFLAGS),
                extra_ldflags=list(LDFLAGS),
                build_directory=str(directory),
                is_python_module=False,
                verbose=verbose,
            )
        except BaseException as exc:
            what = "failed" if isinstance(exc, Exception) else "was interrupted"
            hint = " (GRAPHATTN_VERBOSE_BUILD=1 shows why)" if what == "failed" and not verbose else ""
            _log(f"building the fused CPU kernel {what} after {time.perf_counter() - start:.1f} s{hint}")
            raise
        seconds = time.perf_counter() - start
        info = {**inputs, "name": name, "build_seconds": round(seconds, 1), "built_at": time.time()}
        tmp = directory / f"{BUILD_INFO}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(info, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, directory / BUILD_INFO)
        _log(f"built the fused CPU kernel in {seconds:.1f} s")


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
