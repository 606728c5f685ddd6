"""``graphattn viz``: the sub-command over the runner's ``restore`` contract (a stand-in runner
here, so the CLI is tested on its own; tests/viz/test_runs.py uses real runs)."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import pytest

from graphattn.__main__ import main
from tests.viz.samples import molecule_sample, node_sample


@dataclass
class FakeTask:
    name: str
    level: str
    modality: str
    items: list[Any]
    labels: list[str] | None

    def num_samples(self) -> int:
        return self.items[0].num_nodes if self.level == "node" else len(self.items)

    def sample(self, i: int) -> Any:
        return self.items[0] if self.level == "node" else self.items[i]

    def node_labels(self, data: Any) -> list[str] | None:
        return self.labels


@pytest.fixture
def fake_runner(monkeypatch):
    calls = []
    registry: dict[str, tuple[Any, FakeTask]] = {}

    def restore(path, seed=None, device="cpu", **kw):
        calls.append((str(path), seed, device, kw))
        return registry[str(path).rstrip("/").split("/")[-1]]

    mod = types.ModuleType("graphattn.runner")
    mod.restore = restore
    monkeypatch.setitem(__import__("sys").modules, "graphattn.runner", mod)
    mol = molecule_sample()
    registry["pep"] = (mol.model, FakeTask("peptides-func", "graph", "molecule", [mol.data.get_example(0)],
                                           mol.labels))
    node = node_sample()
    registry["cora"] = (node.model, FakeTask("cora", "node", "graph", [node.data], node.labels))
    return calls


def test_cli_html_and_png(fake_runner, tmp_path, capsys):
    run = tmp_path / "pep"
    run.mkdir()
    out = tmp_path / "pep.html"
    assert main(["viz", str(run), "--sample", "0", "--out", str(out), "--seed", "1"]) == 0
    page = out.read_text()
    assert "pep · peptides-func · test sample 0\nunion(input+expander+virtual), per_head_random" in page
    assert fake_runner[-1][:3] == (str(run), 1, "cpu")
    text = capsys.readouterr().out
    assert "layers.0.attn" in text and "expander" in text and f"wrote {out}" in text
    assert "H nats" in text and "H/log d" in text  # the entropy columns, named with their unit

    out = tmp_path / "pep.png"
    assert main(["viz", str(run), "--out", str(out), "--figure", "all", "--head", "0", "--top-k", "2",
                 "--dpi", "40"]) == 0
    for kind in ("graph", "heads", "heatmap", "summary"):
        assert (tmp_path / f"pep_{kind}.png").stat().st_size > 1000


def test_cli_node_task_focuses_on_the_sample(fake_runner, tmp_path, capsys):
    run = tmp_path / "cora"
    run.mkdir()
    out = tmp_path / "cora.png"
    assert main(["viz", str(run), "--sample", "7", "--out", str(out), "--max-nodes", "10",
                 "--layer", "layers.1.attn", "--data-root", "/data"]) == 0
    assert out.stat().st_size > 1000
    assert fake_runner[-1][3] == {"data_root": "/data"}
    assert "attention neighbourhood of node 7: 10 nodes" in capsys.readouterr().out


def test_cli_rejects_bad_arguments(fake_runner, tmp_path, capsys):
    run = tmp_path / "pep"
    run.mkdir()
    assert main(["viz", str(run), "--sample", "5", "--out", str(tmp_path / "x.html")]) == 2
    assert "--sample must be a test sample index in [0, 1)" in capsys.readouterr().err
    assert main(["viz", str(run), "--out", str(tmp_path / "x.gif")]) == 2
    with pytest.raises(SystemExit):
        main(["viz", str(run), "--out", str(tmp_path / "x.png"), "--head", "first"])
