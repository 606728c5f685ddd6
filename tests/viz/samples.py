"""Small samples of the four kinds the viewer draws, each traced through a GraphTransformer.

* node task: a two-community citation-like graph (stochastic block model), one graph;
* graph task: a peptide (ogb ``smiles2graph``), atom symbols as labels;
* sequence: a ListOps-like token sequence with a CLS node at index 0 (``pos = -1``);
* image: a 16×16 image as 4×4 patches in raster order, ``pos = (row, col)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Batch, Data
from torch_geometric.utils import stochastic_blockmodel_graph

import graphattn as ga
from graphattn.core.edgeset import EdgeSet
from graphattn.core.origins import origin_code
from graphattn.producers.base import EdgeProducer, ProducerContext
from graphattn.tracing import AttentionTrace
from graphattn.viz import trace_sample

PEPTIDE = "CC(C)C[C@H](NC(=O)[C@@H](N)Cc1ccccc1)C(=O)N[C@@H](CO)C(=O)O"  # Phe-Leu-Ser
TOKENS = ["<pad>", "<cls>", "[MAX", "[MIN", "[MED", "[SM", "]", *[str(d) for d in range(10)]]


class PerHeadRandom(EdgeProducer):
    """Test producer: per-head edges (head ``h`` sees ``k + h`` random sources per target), with a
    duplicate of every target's first edge, so per-head, duplicate and mean views differ."""

    name = "per_head_random"

    def __init__(self, k: int = 2, seed: int = 0) -> None:
        super().__init__()
        self.k, self.seed = k, seed

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        g = torch.Generator().manual_seed(self.seed)
        ptr, batch = ctx.ptr.cpu(), ctx.batch.cpu()
        src, dst, head = [], [], []
        for h in range(ctx.num_heads):
            for i in range(ctx.num_nodes):
                b = int(batch[i])
                lo, hi = int(ptr[b]), int(ptr[b + 1])
                js = lo + torch.randint(0, hi - lo, (self.k + h,), generator=g)
                js = torch.cat([js, js[:1]])  # a duplicate edge
                src.append(js)
                dst.append(torch.full_like(js, i))
                head.append(torch.full_like(js, h))
        ei = torch.stack([torch.cat(src), torch.cat(dst)]).to(ctx.device)
        code = origin_code("sampled")
        return EdgeSet(ei, head=torch.cat(head).to(ctx.device), num_heads=ctx.num_heads,
                       origin=torch.full((ei.size(1),), code, dtype=torch.long, device=ctx.device))


@dataclass
class Sample:
    kind: str
    data: Any
    model: torch.nn.Module
    trace: AttentionTrace
    labels: list[str] | None
    focus: int | None = None


def _model(producers: list[Any], *, heads: int = 2, hidden: int = 16, **kw: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    return ga.GraphTransformer(hidden, 3, num_layers=len(producers), producer=producers, heads=heads,
                               **kw).eval()


def node_sample() -> Sample:
    torch.manual_seed(0)
    ei = stochastic_blockmodel_graph([14, 12], [[0.35, 0.03], [0.03, 0.35]], directed=False)
    y = torch.cat([torch.zeros(14), torch.ones(12)]).long()
    data = Data(x=torch.randn(26, 8) + y[:, None].float(), edge_index=ei, y=y, num_nodes=26)
    union = {"name": "union", "producers": [{"name": "input", "self_loops": True},
                                            {"name": "random", "k": 3}]}
    model = _model([union, "full"], task="node", conv="gcn")
    return Sample("graph", data, model, trace_sample(model, data),
                  [f"class {int(c)}" for c in y], focus=3)


def molecule_sample() -> Sample:
    from ogb.utils import smiles2graph
    from rdkit import Chem

    g = smiles2graph(PEPTIDE)
    d = Data(x=torch.as_tensor(g["node_feat"]).float(), edge_index=torch.as_tensor(g["edge_index"]),
             num_nodes=int(g["num_nodes"]))
    table = Chem.GetPeriodicTable()
    labels = [table.GetElementSymbol(int(a) + 1) for a in d.x[:, 0]]
    exphormer = {"name": "union", "producers": ["input", {"name": "expander", "degree": 2}, "virtual"]}
    model = _model([exphormer, PerHeadRandom(k=2)])
    batch = Batch.from_data_list([d])
    return Sample("molecule", batch, model, trace_sample(model, batch), labels)


def sequence_tokens() -> list[str]:
    return ["<cls>", "[MAX", "2", "9", "[MIN", "4", "7", "]", "0", "[SM", "1", "3", "]", "]"]


def sequence_sample(extra_labels: list[str] | None = None) -> Sample:
    toks = sequence_tokens()
    ids = torch.tensor([TOKENS.index(t) for t in toks])
    n = ids.numel()
    pos = torch.cat([torch.tensor([-1.0]), torch.arange(n - 1, dtype=torch.float)])[:, None]
    i = torch.arange(1, n - 1)
    ei = torch.cat([torch.stack([i, i + 1]), torch.stack([i + 1, i])], 1)
    d = Data(x=ids, pos=pos, edge_index=ei, num_nodes=n)
    model = _model([{"name": "window", "window": 2}, "full"], node_encoder="embedding",
                   num_embeddings=len(TOKENS))
    batch = Batch.from_data_list([d])
    return Sample("sequence", batch, model, trace_sample(model, batch), extra_labels or toks)


def image_sample() -> Sample:
    g = torch.Generator().manual_seed(1)
    img = torch.zeros(16, 16)
    img[3:13, 5:11] = 1.0  # a bright rectangle
    img += 0.05 * torch.rand(16, 16, generator=g)
    p = 4
    x = img.reshape(4, p, 4, p).permute(0, 2, 1, 3).reshape(16, p * p)
    rows, cols = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    pos = torch.stack([rows.reshape(-1), cols.reshape(-1)], 1).float()
    d = Data(x=x, pos=pos, edge_index=grid_edges(4, 4), num_nodes=16, image=img)
    model = _model([{"name": "knn", "k": 3}, "full"])
    batch = Batch.from_data_list([d])
    return Sample("image", batch, model, trace_sample(model, batch), None)


def grid_edges(h: int, w: int) -> Tensor:
    idx = torch.arange(h * w).view(h, w)
    a = torch.cat([idx[:, :-1].reshape(-1), idx[:-1, :].reshape(-1)])
    b = torch.cat([idx[:, 1:].reshape(-1), idx[1:, :].reshape(-1)])
    return torch.cat([torch.stack([a, b]), torch.stack([b, a])], 1)


def expected_count(record: Any, graph_nodes: Tensor | None, head: int | None) -> int:
    """Edges of ``record`` into ``graph_nodes`` in ``head`` (distinct pairs for the mean), counted
    straight from the trace."""
    ei = record.edges.edge_index
    keep = torch.ones(ei.size(1), dtype=torch.bool)
    if graph_nodes is not None:
        keep &= torch.isin(ei[1], graph_nodes)
    if head is None:
        return len({(int(s), int(t)) for s, t in ei[:, keep].T})
    if record.edges.head is not None:
        keep &= record.edges.head == head
    return int(keep.sum())
