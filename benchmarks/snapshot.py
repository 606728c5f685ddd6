r"""Bit-for-bit snapshot of what the models compute, for refactors that must not change a number.

Two parts, both on fixed inputs and seeds, on this machine:

* **layers** — a :class:`~graphattn.GraphTransformer` with each registered producer (every paper
  mechanism, the static producers, the Exphormer union with bond-like edge features) and the two
  presets, on one synthetic batch of graphs: the output in evaluation mode (seeded) and in
  training mode (seeded generator), the gradient of every parameter and of the input, the
  auxiliary loss and the policy terms;
* **configs** — every shipped config (``examples/configs/*.toml``) trained on tiny data past all
  of its phases (as ``tests/runner/test_configs.py`` does): the final and best checkpoints' model
  and optimizer tensors, and the reported metrics.

``--save FILE`` writes the snapshot; ``--compare FILE`` recomputes it and reports every tensor that
is not bit-identical (exit status 1). Bits are compared on one machine only: a snapshot taken on
another CPU, or with other thread counts, may differ in the last bits and proves nothing. The
configs part runs on one thread (multi-threaded CPU training is not bit-reproducible in PyTorch:
see :func:`snapshot`)::

    GRAPHATTN_MIRROR=../shared/datasets python benchmarks/snapshot.py --save /tmp/before.pt
    # ... change the code ...
    GRAPHATTN_MIRROR=../shared/datasets python benchmarks/snapshot.py --compare /tmp/before.pt
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphattn import GraphTransformer  # noqa: E402
from graphattn.nn.registry import get_model  # noqa: E402

#: producer specs of the layer part (hybrid model, GINE local branch where edge features exist)
PRODUCERS: dict[str, Any] = {
    "full": "full",
    "input": "input",
    "window": {"name": "window", "window": 2},
    "global": "global",
    "knn": {"name": "knn", "k": 3},
    "random": {"name": "random", "k": 3},
    "exphormer": {"name": "union", "producers": ["input", {"name": "expander", "degree": 3}, "virtual"]},
    "samsa": {"name": "samsa", "k": 4},
    "sbm": {"name": "sbm", "num_clusters": 3},
    "sliceformer": "sliceformer",
    "sac": {"name": "sac", "warm_start": 0},
    "sac_parallel": {"name": "sac", "policy": "parallel", "warm_start": 0},
    "converter": "converter",
}
PRESETS = ("samsa", "converter")


def synthetic_batch(seed: int = 0) -> Any:
    """Three graphs (7, 1 and 12 nodes), ring-plus-chords edges, 8 features, 3 edge features."""
    from torch_geometric.data import Batch, Data

    g = torch.Generator().manual_seed(seed)
    graphs = []
    for n in (7, 1, 12):
        src = torch.arange(n)
        ring = torch.stack([src, (src + 1) % n]) if n > 1 else torch.empty(2, 0, dtype=torch.long)
        chords = torch.randint(0, n, (2, n), generator=g)
        ei = torch.cat([ring, ring.flip(0), chords], 1)
        graphs.append(Data(x=torch.randn(n, 8, generator=g), edge_index=ei,
                           edge_attr=torch.randn(ei.size(1), 3, generator=g),
                           pos=torch.arange(n, dtype=torch.float).unsqueeze(1),
                           y=torch.randn(1, 2, generator=g)))
    return Batch.from_data_list(graphs)


def _model(name: str, preset: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    if preset:
        return get_model(name)(16, 2, num_layers=2, producer=name,
                               **({"heads": 2} if name == "samsa" else {}))
    spec = PRODUCERS[name]
    edge = name in ("exphormer", "input")
    return GraphTransformer(16, 2, num_layers=2, producer=spec, heads=2,
                            conv="gine" if edge else "gcn", edge_encoder="linear" if edge else None,
                            attn_dropout=0.0 if name == "converter" else 0.1, dropout=0.1)


def layer_snapshot() -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    data = synthetic_batch()
    cases = [(n, False) for n in PRODUCERS] + [(n, True) for n in PRESETS]
    for name, preset in cases:
        key = f"{'preset' if preset else 'hybrid'}/{name}"
        model = _model(name, preset)
        model.eval()
        with torch.no_grad():
            out[f"{key}/eval"] = model(data, generator=torch.Generator().manual_seed(1))
        model.train()
        x = data.x.clone().requires_grad_(True)
        batch = data.clone()
        batch.x = x
        y = model(batch, generator=torch.Generator().manual_seed(2))
        loss = (y - data.y).pow(2).mean()
        aux = model.aux_loss()  # the last forward's signals (kept stable for the before/after check)
        if aux is not None:
            out[f"{key}/aux"] = aux.detach()
            loss = loss + aux
        for i, (lp, graph) in enumerate(model.policy_terms()):
            out[f"{key}/log_prob{i}"] = lp.detach()
            out[f"{key}/log_prob_graph{i}"] = graph
            loss = loss - lp.sum() * 1e-3
        loss.backward()
        out[f"{key}/train"] = y.detach()
        out[f"{key}/grad_x"] = x.grad
        for pname, p in model.named_parameters():
            if p.grad is not None:
                out[f"{key}/grad/{pname}"] = p.grad
    return out


def config_snapshot() -> dict[str, Tensor]:
    sys.path.insert(0, str(ROOT / "tests" / "runner"))
    from test_configs import CONFIGS, tiny  # the tests' tiny-data recipe

    from graphattn.runner.config import load_config_file
    from graphattn.runner.train import run_experiment

    out: dict[str, Tensor] = {}
    for path in CONFIGS:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = tiny(load_config_file(path), Path(tmp) / "run")
            (r,) = run_experiment(cfg)["results"]
            for metric in ("val", "test"):
                value = r[metric]
                out[f"config/{path.stem}/{metric}"] = torch.tensor(
                    math.nan if value is None else float(value), dtype=torch.float64)
            for ck in ("best", "last"):
                state = torch.load(Path(tmp) / "run" / "seed0" / f"{ck}.pt", weights_only=False)
                for group in ("model", "optimizer"):
                    _flatten(state.get(group), f"config/{path.stem}/{ck}/{group}", out)
    return out


def _flatten(obj: Any, prefix: str, out: dict[str, Tensor]) -> None:
    if isinstance(obj, Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}/{k}", out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flatten(v, f"{prefix}/{i}", out)


def snapshot(parts: list[str]) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    if "layers" in parts:
        torch.set_num_threads(2)
        out.update(layer_snapshot())
    if "configs" in parts:
        # one thread: PyTorch's CPU backward of advanced indexing (index_put_ with accumulation)
        # adds with atomics across threads above 32k elements, so multi-threaded training is not
        # bit-reproducible from run to run (SAMSA's configs show it)
        torch.set_num_threads(1)
        out.update(config_snapshot())
    return {k: v.detach().cpu() for k, v in out.items()}


def compare(old: dict[str, Tensor], new: dict[str, Tensor]) -> list[str]:
    problems = [f"missing now: {k}" for k in old if k not in new]
    problems += [f"new: {k}" for k in new if k not in old]
    for k in old.keys() & new.keys():
        a, b = old[k], new[k]
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{k}: {a.dtype}{list(a.shape)} -> {b.dtype}{list(b.shape)}")
        elif not torch.equal(a, b) and not (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                             and torch.equal(a.nan_to_num(), b.nan_to_num())):
            diff = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else "ints"
            problems.append(f"{k}: differs (max abs diff {diff})")
    return sorted(problems)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", type=Path, help="write the snapshot to this file")
    group.add_argument("--compare", type=Path, help="compare against a snapshot written earlier")
    ap.add_argument("--parts", nargs="+", default=["layers", "configs"], choices=["layers", "configs"])
    args = ap.parse_args(argv)
    snap = snapshot(args.parts)
    if args.save:
        torch.save(snap, args.save)
        print(f"{len(snap)} tensors written to {args.save}")
        return 0
    old = torch.load(args.compare, weights_only=True)
    old = {k: v for k, v in old.items() if k.split("/")[0] in
           ({"hybrid", "preset"} if "layers" in args.parts else set())
           | ({"config"} if "configs" in args.parts else set())}
    problems = compare(old, snap)
    for p in problems:
        print(p)
    verdict = f"{len(problems)} differ" if problems else "all bit-identical"
    print(f"{len(snap)} tensors compared: {verdict}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
