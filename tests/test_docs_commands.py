"""Every ``graphattn run`` / ``graphattn viz`` command written in the README and the docs runs as
written: each is parsed with the real command line, its configuration resolved, and then trained on
tiny data (``LIMIT`` samples per split, 1 epoch, one seed, no time budget) into the ``--out`` it
names, inside a temporary folder; the ``viz`` commands then draw from those run folders, so a doc
that points the viewer at a folder no documented command creates fails here."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from graphattn.__main__ import main as cli_main

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "datasets" / "README.md", *(ROOT / "docs").rglob("*.md")])
INLINE = re.compile(r"`((?:[A-Z_]+=\S+\s+)*(?:\S*/)?graphattn\s+(?:run|viz)\b[^`]*)`")
#: samples per split (graph tasks; node tasks keep LIMIT // 3 nodes per mask): enough for the
#: ``--sample`` indices the docs use
LIMIT = 48


def _fenced_lines(text: str) -> list[str]:
    lines, inside, buf = [], False, ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("```"):
            inside = not inside
            continue
        if not inside:
            continue
        buf += raw.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        lines.append(buf)
        buf = ""
    return lines


def _graphattn_args(command: str) -> list[str] | None:
    for part in command.split("&&"):
        try:
            tokens = shlex.split(part, comments=True)
        except ValueError:
            continue
        for i, tok in enumerate(tokens):
            if (tok == "graphattn" or tok.endswith("/graphattn")) and i + 1 < len(tokens) \
                    and tokens[i + 1] in ("run", "viz"):
                return tokens[i + 1:]
            if tok == "-m" and i + 2 < len(tokens) and tokens[i + 1] == "graphattn" \
                    and tokens[i + 2] in ("run", "viz"):
                return tokens[i + 2:]
        if part.strip().endswith(("graphattn", "graphattn run")) and "bin/graphattn" in part:
            return ["run"]
    return None


def documented_commands() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        candidates = [*INLINE.findall(text),
                      *(line for line in _fenced_lines(text) if "graphattn" in line)]
        for cmd in candidates:
            args = _graphattn_args(cmd)
            if args is None or "--help" in args or "-h" in args:
                continue
            if any("<" in a and ">" in a for a in args):  # a placeholder such as <run>
                continue
            if len(args) == 1 and args[0] == "viz":  # the command named in prose
                continue
            entry = (str(doc.relative_to(ROOT)), args)
            if entry not in found:
                found.append(entry)
    return found


def _here(args: list[str]) -> list[str]:
    """``args`` with a CUDA ``--device`` replaced by ``cpu`` on a machine without CUDA: a
    documented GPU command still parses, resolves and trains here."""
    import torch

    if torch.cuda.is_available():
        return args
    return ["cpu" if i and args[i - 1] == "--device" and a.startswith("cuda") else a
            for i, a in enumerate(args)]


COMMANDS = documented_commands()


def test_the_docs_have_commands():
    subs = {args[0] for _, args in COMMANDS}
    assert subs == {"run", "viz"} and len(COMMANDS) >= 10


def _tiny(cfg: dict) -> dict:
    from graphattn.runner.config import resolve_config

    cfg = dict(cfg)
    task = resolve_config(cfg)["task"]
    kwargs = {**cfg.get("task_kwargs", {}), "limit": LIMIT}
    if task == "listops":
        kwargs.update(num_train=LIMIT, num_val=LIMIT, num_test=LIMIT, min_length=16, max_length=48)
    if task == "fashion-mnist":
        kwargs.update(num_train=LIMIT, num_val=LIMIT)
    producer = cfg.get("producer")
    if isinstance(producer, dict) and producer.get("warm_start"):
        # one epoch cannot leave a warm start, and no warm-start epoch is ever selected; crossing
        # it is tested on every shipped config in tests/runner/test_configs.py
        cfg["producer"] = {**producer, "warm_start": 0}
    cfg.update(task_kwargs=kwargs, epochs=1, time_budget=None,
               patience=None, progress=False, overwrite=True, resume=False, threads=None,
               seeds=resolve_config(cfg)["seeds"][:1])
    return cfg


def test_documented_commands_run_as_written(mirror, tmp_path, monkeypatch):
    """All documented commands, in a temporary working folder: ``run`` ones first (on tiny data),
    then ``viz`` ones on the folders those wrote."""
    from graphattn.__main__ import build_parser
    from graphattn.runner.cli import config_from_args
    from graphattn.runner.train import run_experiment

    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "docs" / "viz").mkdir(parents=True)  # the screenshots' commands write there
    failures = []
    done: dict[str, str] = {}  # the same tiny run (up to its folder) is trained once, then copied
    for doc, args in [c for c in COMMANDS if c[1][0] == "run"]:
        try:
            parsed = build_parser(only="run").parse_args(_here(args))
            cfg = _tiny(config_from_args(parsed))
            key = repr(sorted((k, v) for k, v in cfg.items() if k != "out"))
            if key in done:
                if not Path(cfg["out"]).exists():
                    shutil.copytree(done[key], cfg["out"])
                continue
            run_experiment(cfg)
            done[key] = cfg["out"]
        except (Exception, SystemExit) as exc:
            failures.append(f"{doc}: graphattn {shlex.join(args)}\n    {type(exc).__name__}: {exc}")
    for doc, args in [c for c in COMMANDS if c[1][0] == "viz"]:
        try:
            code = cli_main([*args, "--debug"])
            if code != 0:
                raise RuntimeError(f"exit status {code}")
        except (Exception, SystemExit) as exc:
            failures.append(f"{doc}: graphattn {shlex.join(args)}\n    {type(exc).__name__}: {exc}")
    assert not failures, "documented commands that fail:\n" + "\n".join(failures)


@pytest.mark.parametrize("doc,args", COMMANDS, ids=[f"{d}:{' '.join(a)[:60]}" for d, a in COMMANDS])
def test_documented_command_parses(doc, args):
    """Flags exist, JSON is valid, config files exist, the configuration resolves."""
    from graphattn.__main__ import build_parser

    parsed = build_parser(only=args[0]).parse_args(_here(args))
    if args[0] == "run":
        from graphattn.runner.cli import config_from_args
        from graphattn.runner.config import resolve_config

        resolve_config(config_from_args(parsed))


#: what the README's Python blocks assume is defined (a small graph batch with edge features)
README_PRELUDE = """
import torch
from torch_geometric.data import Batch, Data
graphs = [Data(x=torch.randn(n, 5), edge_index=torch.tensor([[i for i in range(n - 1)],
                                                              [i + 1 for i in range(n - 1)]]),
               edge_attr=torch.randn(n - 1, 3)) for n in (6, 4)]
data = Batch.from_data_list(graphs)
x, edge_index, batch = data.x, data.edge_index, data.batch
"""


def test_every_python_block_of_the_readme_runs():
    """The README's Python blocks, in order, in one fresh interpreter after a prelude that defines
    the data they name (``x``, ``edge_index``, ``batch``, ``data``); no block may use a
    deprecated call (a FutureWarning fails it)."""
    import subprocess
    import sys

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2
    code = README_PRELUDE + "import graphattn, warnings\nwarnings.simplefilter('error', FutureWarning)\n"
    code += "\n".join(blocks)
    code += "\nassert out.shape == (2, 10)\nprint('ok')\n"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]
