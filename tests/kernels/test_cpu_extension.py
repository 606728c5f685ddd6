"""Building and loading the fused CPU extension (:mod:`graphattn.kernels.cpu_extension`).

torch's ``load`` is replaced by a fake that behaves like it where it matters (it appends to the
flag lists it is given, writes the library into ``build_directory`` and, for the stale-lock test,
leaves torch's ``lock`` file behind), so these tests take milliseconds; the one real build is
marked ``slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension as cpp_extension
from graphattn.kernels import cpu_extension as ce

BUILDING = "building the fused CPU kernel for this environment"
BUILT = "built the fused CPU kernel in"


class FakeLoad:
    """Stands in for ``torch.utils.cpp_extension.load``."""

    def __init__(self, error: BaseException | None = None):
        self.calls: list[dict] = []
        self.error = error

    def __call__(self, name, sources, extra_cflags=None, extra_ldflags=None, build_directory=None, **kw):
        # torch's FileBaton would wait forever on a lock file left by a killed build
        assert not (Path(build_directory) / "lock").exists()
        self.calls.append(
            {
                "name": name,
                "build_directory": build_directory,
                "cflags": list(extra_cflags),
                "ldflags": list(extra_ldflags),
                "cflags_is_module_list": extra_cflags is ce.CFLAGS,
                "ldflags_is_module_list": extra_ldflags is ce.LDFLAGS,
                **kw,
            }
        )
        extra_ldflags.extend(["-L/some/venv/torch/lib", "-lc10", "-ltorch"])  # as torch does
        extra_cflags.append("-DTORCH_EXTENSION_NAME=" + name)
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        Path(build_directory, f"{name}.so").write_bytes(b"not really a library")
        return str(Path(build_directory, f"{name}.so"))


@pytest.fixture
def ext_root(tmp_path, monkeypatch):
    root = tmp_path / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    monkeypatch.delenv("GRAPHATTN_VERBOSE_BUILD", raising=False)
    monkeypatch.delenv("GRAPHATTN_NO_CPU_EXTENSION", raising=False)
    return root


@pytest.fixture
def fake_load(monkeypatch, ext_root):
    fake = FakeLoad()
    monkeypatch.setattr(cpp_extension, "load", fake)
    loaded: list[Path] = []
    monkeypatch.setattr(ce, "_load_library", loaded.append)
    fake.loaded = loaded
    return fake


@pytest.fixture
def fresh_state(monkeypatch):
    state = {"ops": None, "error": None, "tried": False, "warned": False}
    monkeypatch.setattr(ce, "_state", state)
    return state


# ----------------------------------------------------------------------------- name and folder


def test_name_is_stable_and_flag_lists_are_not_modified(fake_load, ext_root, capsys):
    cflags, ldflags = list(ce.CFLAGS), list(ce.LDFLAGS)
    name = ce.extension_name()
    assert ce.extension_name() == name and name.startswith("graphattn_fused_")
    directory = ce.build_directory()
    assert directory == ext_root.resolve() / "graphattn" / name

    ce._build()
    assert len(fake_load.calls) == 1
    call = fake_load.calls[0]
    assert call["name"] == name and call["build_directory"] == str(directory)
    assert call["cflags"] == cflags and call["ldflags"] == ldflags
    assert not call["cflags_is_module_list"] and not call["ldflags_is_module_list"]
    assert call["is_python_module"] is False and call["verbose"] is False
    # torch appended to the lists it was given, not to ours: same flags, same name, same folder
    assert ce.CFLAGS == cflags and ce.LDFLAGS == ldflags
    assert ce.extension_name() == name and ce.build_directory() == directory
    info = json.loads((directory / ce.BUILD_INFO).read_text())
    assert info["name"] == name and info["ldflags"] == ldflags
    err = capsys.readouterr().err
    when = "once; 40 s to a few minutes, longer on a busy machine"
    assert f"graphattn: {BUILDING} ({when}) in {directory} ..." in err
    assert BUILT in err and len(err.strip().splitlines()) == 2

    # a finished build is loaded directly: no torch build step, nothing printed
    ce._build()
    ce._build()
    assert len(fake_load.calls) == 1
    assert fake_load.loaded == [directory / f"{name}.so"] * 2
    assert capsys.readouterr().err == ""


def test_cpu_ops_builds_once_per_process_and_keeps_the_name(fake_load, fresh_state, capsys):
    name = ce.extension_name()
    ops = ce.cpu_ops(warn=False)
    assert ops is not None and ce.cpu_extension_error() is None
    assert ce.cpu_ops() is ops and ce.cpu_ops(warn=False) is ops
    assert len(fake_load.calls) == 1 and ce.extension_name() == name
    assert BUILDING in capsys.readouterr().err


def test_verbose_build_is_passed_to_torch(fake_load, monkeypatch):
    monkeypatch.setenv("GRAPHATTN_VERBOSE_BUILD", "1")
    ce._build()
    assert fake_load.calls[0]["verbose"] is True


@pytest.mark.parametrize(
    "change",
    ["sys.prefix", "torch path", "torch version", "python abi", "compiler", "cflags", "cpu", "ext dir"],
)
def test_build_directory_depends_on_the_environment(change, monkeypatch, ext_root):
    name, directory = ce.extension_name(), ce.build_directory()
    if change == "sys.prefix":  # another virtual environment with the same torch
        monkeypatch.setattr(sys, "prefix", "/elsewhere/.venv")
    elif change == "torch path":  # another torch install
        monkeypatch.setattr(torch, "__file__", "/elsewhere/site-packages/torch/__init__.py")
    elif change == "torch version":
        monkeypatch.setattr(torch, "__version__", "0.0.1+other")
    elif change == "python abi":
        monkeypatch.setattr(sys, "abiflags", "t", raising=False)
    elif change == "compiler":
        monkeypatch.setenv("CXX", "clang++-never-installed")
    elif change == "cflags":
        monkeypatch.setattr(ce, "CFLAGS", [*ce.CFLAGS, "-DEXTRA"])
    elif change == "cpu":
        monkeypatch.setattr(ce, "_cpu_signature", lambda: "a different cpu")
    else:  # another root: another folder, but the same build (same name)
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext_root / "other"))
        assert ce.extension_name() == name and ce.build_directory() != directory
        return
    assert ce.extension_name() != name
    assert ce.build_directory() != directory
    assert ce.build_directory().parent == directory.parent


def test_build_inputs_do_not_depend_on_the_working_directory(tmp_path, monkeypatch):
    name = ce.extension_name()
    monkeypatch.chdir(tmp_path)
    assert ce.extension_name() == name


# ------------------------------------------------------------------ failures and interruptions


def test_interrupted_build_retries_under_the_same_name(fake_load, monkeypatch, capsys):
    fake_load.error = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        ce._build()
    assert "was interrupted after" in capsys.readouterr().err
    ce._build()
    first, second = fake_load.calls
    assert first["name"] == second["name"] == ce.extension_name()
    assert first["build_directory"] == second["build_directory"]
    assert first["ldflags"] == second["ldflags"] == ce.LDFLAGS
    assert BUILT in capsys.readouterr().err


def test_failed_build_returns_none_and_warns_once(fake_load, fresh_state, capsys):
    fake_load.error = RuntimeError("Error building extension 'x'\nc++: not found")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ce.cpu_ops() is None
        assert ce.cpu_ops() is None
    messages = [str(w.message) for w in caught if "fused CPU kernel" in str(w.message)]
    assert len(messages) == 1 and "c++: not found" in messages[0]
    assert "c++: not found" in ce.cpu_extension_error()
    assert "GRAPHATTN_VERBOSE_BUILD=1" in capsys.readouterr().err
    assert not (ce.build_directory() / ce.BUILD_INFO).exists()


def test_disabled_by_environment(fake_load, fresh_state, monkeypatch):
    monkeypatch.setenv("GRAPHATTN_NO_CPU_EXTENSION", "1")
    assert ce.cpu_ops(warn=False) is None
    assert "GRAPHATTN_NO_CPU_EXTENSION" in ce.cpu_extension_error()
    assert fake_load.calls == []


def test_damaged_build_is_rebuilt(fake_load, monkeypatch, capsys):
    ce._build()
    capsys.readouterr()

    def broken(path):
        raise OSError("invalid ELF header")

    monkeypatch.setattr(ce, "_load_library", broken)
    ce._build()  # the finished build does not load: it is rebuilt (torch's load loads the new one)
    assert len(fake_load.calls) == 2
    assert (ce.build_directory() / ce.BUILD_INFO).exists()
    assert BUILDING in capsys.readouterr().err


# ------------------------------------------------------------------------------- stale locks


def test_stale_torch_lock_is_removed(fake_load, capsys):
    """A killed build left torch's ``lock``: the next build removes it instead of waiting forever."""
    directory = ce.build_directory()
    directory.mkdir(parents=True)
    (directory / "lock").touch()
    ce._build()  # FakeLoad asserts the lock is gone
    assert len(fake_load.calls) == 1 and not (directory / "lock").exists()


def test_lock_age_decides_without_flock(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()
    assert not ce._remove_stale_torch_lock(tmp_path, have_flock=False) and lock.exists()
    old = time.time() - ce.STALE_LOCK_SECONDS - 60
    os.utime(lock, (old, old))
    assert ce._remove_stale_torch_lock(tmp_path, have_flock=False) and not lock.exists()
    lock.touch()
    assert ce._remove_stale_torch_lock(tmp_path, have_flock=True) and not lock.exists()
    assert not ce._remove_stale_torch_lock(tmp_path, have_flock=True)


BUILDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import torch.utils.cpp_extension as cpp_extension
    from graphattn.kernels import cpu_extension as ce

    def hanging_load(name, sources, build_directory=None, **kw):
        Path(build_directory, "lock").touch()  # torch's FileBaton
        print("BUILDING", flush=True)
        time.sleep(600)

    cpp_extension.load = hanging_load
    ce._build()
    """
)


@pytest.mark.skipif(ce.fcntl is None, reason="needs fcntl.flock")
def test_killed_builder_blocks_until_it_dies_then_its_lock_is_removed(fake_load, ext_root, capsys):
    """A live builder holds the flock: a second process waits (and leaves torch's lock alone);
    once the builder is killed (SIGKILL: no cleanup at all) the waiter removes the stale lock and builds."""
    directory = ce.build_directory()
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext_root)}
    child = subprocess.Popen(
        [sys.executable, "-c", BUILDER], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "BUILDING", child.stderr.read()
        assert (directory / "lock").exists()
        errors: list[BaseException] = []

        def build():
            try:
                ce._build()
            except BaseException as exc:
                errors.append(exc)

        waiter = threading.Thread(target=build, daemon=True)
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive() and fake_load.calls == []  # waiting on the live builder
        assert (directory / "lock").exists()
    finally:
        child.kill()
        child.wait(30)
    waiter.join(30)
    assert not waiter.is_alive() and errors == []
    assert len(fake_load.calls) == 1 and fake_load.calls[0]["name"] == ce.extension_name()
    assert not (directory / "lock").exists()
    err = capsys.readouterr().err
    assert "waiting for another process building" in err and BUILT in err


# ------------------------------------------------------------------------------ a real build

PROBE = textwrap.dedent(
    """
    import time
    from graphattn.kernels.cpu_extension import cpu_ops, cpu_extension_error
    t = time.perf_counter()
    ops = cpu_ops(warn=False)
    assert ops is not None, cpu_extension_error()
    print(f"{time.perf_counter() - t:.3f}")
    """
)


@pytest.mark.slow
def test_real_build_then_cached_load(tmp_path):
    """One real build (~40 s) into an empty TORCH_EXTENSIONS_DIR, then a silent cached load."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    env.pop("GRAPHATTN_NO_CPU_EXTENSION", None)
    env.pop("GRAPHATTN_VERBOSE_BUILD", None)
    probe = [sys.executable, "-c", PROBE]
    first = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr
    assert BUILDING in first.stderr and BUILT in first.stderr
    second = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "graphattn:" not in second.stderr
    assert float(second.stdout) < 2.0  # cpu_ops() loads the finished build, no compiling
