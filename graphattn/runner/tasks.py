"""Benchmark tasks: data, split, loss, metric and model defaults, by name."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch_geometric.transforms as T
from torch import Tensor
from torch_geometric.data import Data

from graphattn.data import (
    FashionMNIST,
    GeometricShapes,
    ImageToGraph,
    ListOps,
    PeptidesFunctional,
    PeptidesStructural,
    Planetoid,
    PointCloudToGraph,
    SequenceToGraph,
    TUDataset,
    UCRDataset,
)
from graphattn.data.fashion_mnist import CLASSES as FASHION_CLASSES
from graphattn.data.listops import TOKEN_ID, VOCAB
from graphattn.data.peptides import FUNCTION_CLASSES
from graphattn.data.planetoid import CLASSES as PLANETOID_CLASSES


@dataclass
class Task:
    """A benchmark task.

    Node tasks (``level="node"``) hold one graph ``graph`` with ``train_mask`` / ``val_mask`` /
    ``test_mask``; graph tasks hold ``splits = {"train": ds, "val": ds, "test": ds}``.
    ``loss``: ``"ce"`` (cross-entropy), ``"bce"`` (multi-label) or ``"l1"``; ``metric``:
    ``"accuracy"``, ``"ap"`` (LRGB) or ``"mae"``. ``model_defaults`` are GraphTransformer arguments
    the task implies (encoders, read-out).
    """

    name: str
    level: str
    modality: str
    loss: str
    metric: str
    out_channels: int
    graph: Data | None = None
    splits: dict[str, Any] = field(default_factory=dict)
    model_defaults: dict[str, Any] = field(default_factory=dict)
    labels: Sequence[str] | None = None
    token_names: Sequence[str] | None = None
    notes: str = ""

    # --- the viewer's interface -------------------------------------------------------------
    def num_samples(self) -> int:
        if self.level == "node":
            assert self.graph is not None
            return int(self.graph.num_nodes)
        return len(self.splits["test"])

    def sample(self, i: int) -> Data:
        """The i-th test graph (graph tasks), or the whole graph (node tasks; the viewer focuses
        on node ``i``)."""
        if self.level == "node":
            assert self.graph is not None
            return self.graph
        return self.splits["test"][i]

    def node_labels(self, data: Data) -> list[str] | None:
        if self.token_names is not None and data.x is not None and data.x.dim() == 1:
            return [self.token_names[int(t)] for t in data.x]
        if self.modality == "molecule" and data.x is not None:
            from rdkit import Chem

            table = Chem.GetPeriodicTable()
            return [table.GetElementSymbol(int(a) + 1) for a in data.x[:, 0]]
        if self.level == "node" and self.labels is not None and data.y is not None:
            return [self.labels[int(c)] for c in data.y]
        return None


def _random_split(n: int, fractions: tuple[float, float], seed: int) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g)
    n_val, n_test = round(fractions[0] * n), round(fractions[1] * n)
    return {"val": perm[:n_val], "test": perm[n_val : n_val + n_test], "train": perm[n_val + n_test :]}


def _stratified_split(y: Tensor, fractions: tuple[float, float], seed: int) -> dict[str, Tensor]:
    parts: dict[str, list[Tensor]] = {"train": [], "val": [], "test": []}
    for c in torch.unique(y):
        idx = (y == c).nonzero().view(-1)
        sub = _random_split(idx.numel(), fractions, seed + int(c))
        for k in parts:
            parts[k].append(idx[sub[k]])
    return {k: torch.cat(v).sort().values for k, v in parts.items()}


def _citation(name: str, root: Any, **_: Any) -> Task:
    ds = Planetoid(name, root, transform=T.NormalizeFeatures())
    data = ds[0]
    return Task(name=name, level="node", modality="graph", loss="ce", metric="accuracy",
                out_channels=ds.num_classes, graph=data,
                model_defaults={"node_encoder": "linear"},
                labels=list(PLANETOID_CLASSES.get(name, [str(c) for c in range(ds.num_classes)])),
                notes="public Planetoid split (20 labels per class, 500 val, 1000 test); "
                      "row-normalised features")


def _peptides(kind: str) -> Callable[..., Task]:
    def build(name: str, root: Any, progress: bool = True, **_: Any) -> Task:
        cls = PeptidesFunctional if kind == "func" else PeptidesStructural
        ds = cls(root, progress=progress)
        splits = {k: ds[v] for k, v in ds.split_idx.items()}
        return Task(name=name, level="graph", modality="molecule",
                    loss="bce" if kind == "func" else "l1",
                    metric="ap" if kind == "func" else "mae",
                    out_channels=10 if kind == "func" else 11, splits=splits,
                    labels=list(FUNCTION_CLASSES) if kind == "func" else None,
                    model_defaults={"node_encoder": "atom", "edge_encoder": "bond", "pool": "mean"},
                    notes="official LRGB stratified split; ogb smiles2graph features")

    return build


def _tu(name: str, root: Any, split_seed: int = 0, **_: Any) -> Task:
    ds = TUDataset(name, root)
    y = ds._data.y.view(-1)
    idx = _stratified_split(y, (0.1, 0.1), split_seed)
    splits = {k: ds[v] for k, v in idx.items()}
    defaults: dict[str, Any] = {"node_encoder": "linear", "pool": "mean"}
    return Task(name=name, level="graph", modality="graph", loss="ce", metric="accuracy",
                out_channels=ds.num_classes, splits=splits, model_defaults=defaults,
                notes=f"stratified random 80/10/10 split (seed {split_seed}); TU data sets have "
                      f"no official split")


def _listops(name: str, root: Any, num_train: int = 2000, num_val: int = 200, num_test: int = 200,
             min_length: int = 500, max_length: int = 2000, window: int = 0, seed: int = 0,
             pad_to: int | None = None, **_: Any) -> Task:
    # pad_to: keep <pad> tokens as real nodes up to that length (parity with padded LRA runs,
    # where order-dependent producers such as Sliceformer see the padding)
    graph = SequenceToGraph(window=window, cls_token=TOKEN_ID["<cls>"], pad_to=pad_to,
                            pad_token=TOKEN_ID["<pad>"])
    common = {"min_length": min_length, "max_length": max_length, "seed": seed, "transform": graph}
    splits = {
        "train": ListOps(root, "train", num_samples=num_train, **common),
        "val": ListOps(root, "val", num_samples=num_val, **common),
        "test": ListOps(root, "test", num_samples=num_test, **common),
    }
    return Task(name=name, level="graph", modality="sequence", loss="ce", metric="accuracy",
                out_channels=10, splits=splits, token_names=VOCAB,
                model_defaults={"node_encoder": "embedding", "num_embeddings": len(VOCAB),
                                "pool": "cls", "pe": "position"},
                notes=f"generated ListOps, {num_train}/{num_val}/{num_test} sequences of "
                      f"{min_length}-{max_length} tokens (LRA: 96k/2k/2k), CLS read-out")


def _fashion(name: str, root: Any, patch_size: int = 4, num_train: int | None = None,
             num_val: int = 5000, cls: bool = False, split_seed: int = 0, **_: Any) -> Task:
    graph = ImageToGraph(patch_size=patch_size, connectivity=8, cls=cls)
    train_full = FashionMNIST(root, "train", graph=graph)
    test = FashionMNIST(root, "test", graph=graph)
    perm = torch.randperm(len(train_full), generator=torch.Generator().manual_seed(split_seed))
    val_idx, train_idx = perm[:num_val], perm[num_val:]
    if num_train is not None:
        train_idx = train_idx[:num_train]
    splits = {"train": train_full[train_idx], "val": train_full[val_idx], "test": test}
    return Task(name=name, level="graph", modality="image", loss="ce", metric="accuracy",
                out_channels=10, splits=splits, labels=FASHION_CLASSES,
                model_defaults={"node_encoder": "linear", "pool": "cls" if cls else "mean",
                                "pe": "position"},
                notes=f"{patch_size}x{patch_size} patches in raster order, 8-neighbour grid edges; "
                      f"{len(train_idx)} train / {num_val} val held out of the training set / "
                      f"10000 test")


def _ucr(name: str, root: Any, dataset: str = "GunPoint", patch_size: int = 1, cls: bool = False,
         normalize: bool = False, window: int = 0, val_fraction: float = 0.2, split_seed: int = 0,
         **_: Any) -> Task:
    # UCR/UEA problems bundled with sktime (offline); the graph options go to SequenceToGraph
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) \
            or not 0 <= val_fraction < 1:
        raise ValueError(f"task option 'val_fraction' must be a number in [0, 1), got "
                         f"{val_fraction!r}")
    graph = SequenceToGraph(window=window, patch_size=patch_size, cls=cls, normalize=normalize)
    train_full = UCRDataset(dataset, root, "train", graph=graph)
    test = UCRDataset(dataset, root, "test", graph=graph)
    idx = _stratified_split(train_full.labels, (float(val_fraction), 0.0), split_seed)
    splits = {"train": train_full[idx["train"]], "val": train_full[idx["val"]], "test": test}
    lengths = train_full.lengths()
    return Task(name=name, level="graph", modality="sequence", loss="ce", metric="accuracy",
                out_channels=train_full.num_classes, splits=splits, labels=train_full.classes,
                model_defaults={"node_encoder": "linear", "pool": "cls" if cls else "mean",
                                "pe": "position"},
                notes=f"UCR/UEA {train_full.name} bundled with sktime ({train_full.num_channels} "
                      f"channel(s), length {int(lengths.min())}-{int(lengths.max())}); official "
                      f"TRAIN/TEST split, {len(idx['val'])} validation series held out of the "
                      f"{len(train_full)} TRAIN series (stratified, seed {split_seed}), "
                      f"{len(test)} test; patch_size {patch_size}"
                      + (", z-scored per series" if normalize else ""))


class _Resampled(torch.utils.data.Dataset):
    """The same meshes, with points sampled by a fixed per-item seed (a deterministic view)."""

    def __init__(self, base: Any, num_points: int, k: int, seed: int) -> None:
        self.base, self.num_points, self.k, self.seed = base, num_points, k, seed
        self.graph = PointCloudToGraph(k=k)

    def head(self, n: int) -> _Resampled:
        """The first ``n`` items, sampled as here."""
        return _Resampled(self.base[:min(n, len(self.base))], self.num_points, self.k, self.seed)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> Data:
        state = torch.get_rng_state()
        torch.manual_seed(self.seed * 100_003 + i)
        try:
            data = T.SamplePoints(self.num_points)(self.base[i])
        finally:
            torch.set_rng_state(state)
        return self.graph(data)


def _shapes(name: str, root: Any, num_points: int = 256, k: int = 16, **_: Any) -> Task:
    train = GeometricShapes(root, train=True,
                            transform=T.Compose([T.SamplePoints(num_points),
                                                 PointCloudToGraph(k=k)]))
    val = _Resampled(GeometricShapes(root, train=True), num_points, k, seed=1)
    test = _Resampled(GeometricShapes(root, train=False), num_points, k, seed=2)
    return Task(name=name, level="graph", modality="points", loss="ce", metric="accuracy",
                out_channels=40, splits={"train": train, "val": val, "test": test}, labels=train.classes,
                model_defaults={"node_encoder": "linear", "pool": "mean"},
                notes=f"{num_points} points sampled from each mesh (fresh samples every epoch in "
                      f"training), {k}-NN edges; one mesh per class in train and test, so the "
                      f"validation set is the training meshes with a fixed different sampling")


TASKS: dict[str, Callable[..., Task]] = {
    "cora": _citation,
    "citeseer": _citation,
    "pubmed": _citation,
    "peptides-func": _peptides("func"),
    "peptides-struct": _peptides("struct"),
    "mutag": _tu,
    "proteins": _tu,
    "enzymes": _tu,
    "listops": _listops,
    "fashion-mnist": _fashion,
    "geometric-shapes": _shapes,
    "ucr": _ucr,
}


#: task options every task accepts: ``limit`` (:func:`build_task`'s own) and ``progress`` (the
#: runner passes it to every builder; those without a progress bar ignore it)
COMMON_TASK_OPTIONS = ("limit", "progress")


def task_options(name: str) -> tuple[str, ...] | None:
    """The options task ``name`` accepts (its builder's keyword parameters after ``name`` and
    ``root``, plus :data:`COMMON_TASK_OPTIONS`); ``None`` for a builder taking any ``**kwargs``
    (a catch-all named ``_``, as the built-in builders have, accepts nothing more)."""
    params = list(inspect.signature(TASKS[name]).parameters.values())[2:]
    names = set(COMMON_TASK_OPTIONS)
    for p in params:
        if p.kind is p.VAR_KEYWORD:
            if p.name != "_":
                return None
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            names.add(p.name)
    return tuple(sorted(names))


def check_task_options(name: str, options: dict[str, Any]) -> None:
    """Refuses an unknown task and options the task does not take (``ValueError``)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; available: {', '.join(TASKS)}")
    accepted = task_options(name)
    unknown = [] if accepted is None else sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"unknown task option(s) {', '.join(map(repr, unknown))} for task "
                         f"{name!r} (--task-kwargs / task_kwargs); it accepts: "
                         f"{', '.join(accepted or ())}")


def build_task(name: str, root: str | os.PathLike | None = None, limit: int | None = None,
               **kwargs: Any) -> Task:
    """The task ``name`` (see :data:`TASKS`); ``kwargs`` are task options (sizes, patch size...).

    ``limit`` (a quick check on tiny data): graph tasks keep the first ``limit`` samples of every
    split; node tasks keep the subgraph induced by the first ``limit // 3`` (at least 1) training,
    validation and test nodes each."""
    check_task_options(name, kwargs)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"task option 'limit' must be a positive int, got {limit!r}")
    task = TASKS[name](name, root, **kwargs)
    if limit is not None:
        _limit(task, limit)
    return task


def _limit(task: Task, n: int) -> None:
    if task.level == "node":
        g = task.graph
        assert g is not None
        keep = torch.cat([g[f"{s}_mask"].nonzero().view(-1)[:max(n // 3, 1)]
                          for s in ("train", "val", "test")]).unique()
        task.graph = g.subgraph(keep)
        return
    task.splits = {k: (ds.head(n) if isinstance(ds, _Resampled) else ds[:min(n, len(ds))])
                   for k, ds in task.splits.items()}
