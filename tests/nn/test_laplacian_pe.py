"""``LaplacianPE``: the Laplacian eigenvectors, checked against a float64 dense reference, the same in
every process, and defined on tiny graphs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import erdos_renyi_graph, to_undirected

from graphattn.nn import positional_encoding
from graphattn.nn.laplacian_pe import DENSE_BELOW, LaplacianPE


def connected_graph(n: int, seed: int = 0) -> Data:
    torch.manual_seed(seed)
    ring = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
    ei = to_undirected(torch.cat([ring, erdos_renyi_graph(n, 4 / n)], 1), num_nodes=n)
    return Data(edge_index=ei, num_nodes=n)


def reference(data: Data, k: int) -> tuple[np.ndarray, np.ndarray]:
    n = data.num_nodes
    a = np.zeros((n, n))
    a[data.edge_index[0].numpy(), data.edge_index[1].numpy()] = 1.0
    d = a.sum(1) ** -0.5
    lap = np.eye(n) - d[:, None] * a * d[None, :]
    _, vectors = np.linalg.eigh(lap)
    return lap, vectors[:, 1:k + 1]


@pytest.mark.parametrize("n", [40, 3 * DENSE_BELOW // 2])  # the dense and the sparse solver
def test_equals_the_dense_float64_eigenvectors_up_to_sign(n):
    data, k = connected_graph(n), 8
    lap, ref = reference(data, k)
    pe = LaplacianPE(k)(data.clone()).laplacian_eigenvector_pe.double().numpy()
    for j in range(k):
        # distinct eigenvalues here: each column is the reference's up to its sign
        assert min(np.abs(pe[:, j] - ref[:, j]).max(), np.abs(pe[:, j] + ref[:, j]).max()) < 1e-5
        assert abs(pe[np.abs(pe[:, j]).argmax(), j]) == pe[:, j].max()  # the fixed sign
    assert np.abs(lap @ pe - pe * (pe * (lap @ pe)).sum(0)).max() < 1e-5  # eigenvectors of L


def test_the_same_graph_gets_the_same_encoding_in_every_process():
    """PyG's transform starts ARPACK from a random vector and flips signs with torch's global
    generator: another encoding in every process. Two fresh processes here agree bit for bit, on a
    graph of two components, whose eigenvalue 0 repeats (the basis of that eigenspace is fixed
    too)."""
    code = ("import hashlib, torch; from tests.nn.test_laplacian_pe import connected_graph; "
            "from graphattn.nn import positional_encoding; "
            "g = connected_graph(300); g2 = g.clone(); "
            "g2.edge_index = torch.cat([g.edge_index, g.edge_index + 300], 1); g2.num_nodes = 600; "
            "pe = positional_encoding('laplacian', 16)(g2).laplacian_eigenvector_pe; "
            "print(hashlib.sha256(pe.numpy().tobytes()).hexdigest())")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout


@pytest.mark.parametrize("n", [1, 2, 5])
def test_tiny_graphs_get_k_columns(n):
    ei = torch.stack([torch.arange(n - 1), torch.arange(1, n)]) if n > 1 else torch.empty(2, 0,
                                                                                       dtype=torch.long)
    data = Data(edge_index=to_undirected(ei, num_nodes=n), num_nodes=n)
    pe = LaplacianPE(8)(data).laplacian_eigenvector_pe
    assert pe.shape == (n, 8) and torch.isfinite(pe).all()
    assert (pe[:, n - 1:] == 0).all()  # only n - 1 eigenvectors after the first
    if n > 1:
        assert (pe[:, :n - 1].abs().sum(0) > 0).all()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="'k' must be a positive int"):
        LaplacianPE(0)
    with pytest.raises(ValueError, match="'attr_name'"):
        LaplacianPE(4, attr_name="")
    assert repr(positional_encoding("laplacian", 4)) == \
        "LaplacianPE(k=4, attr_name='laplacian_eigenvector_pe')"


def _laplacian_model(**kwargs):
    from graphattn import GraphTransformer

    torch.manual_seed(0)
    return GraphTransformer(16, 3, num_layers=1, producer="input", pe="laplacian", heads=2, **kwargs)


def test_the_eigenvectors_keep_their_canonical_signs_in_training_unless_asked():
    """``LaplacianPE`` fixes every sign, so training reads the encoding as it is (two training-mode
    passes agree); ``pe_sign_flip=True`` flips each eigenvector's sign at random per pass (for
    eigenvectors of arbitrary sign), so the passes differ."""
    data = LaplacianPE(4)(connected_graph(12))
    data.x = torch.randn(12, 5, generator=torch.Generator().manual_seed(1))
    plain = _laplacian_model().train()
    assert torch.equal(plain(data), plain(data))
    flipping = _laplacian_model(pe_sign_flip=True).train()
    outs = [flipping(data) for _ in range(8)]
    assert any(not torch.equal(outs[0], o) for o in outs[1:])
    flipping.eval()
    assert torch.equal(flipping(data), flipping(data))  # no flip in evaluation


def test_a_sign_flip_needs_eigenvectors():
    with pytest.raises(ValueError, match="'pe_sign_flip' flips the signs of Laplacian eigenvectors"):
        _laplacian_model().__class__(16, 3, pe="random_walk", pe_sign_flip=True)
    with pytest.raises(ValueError, match="'pe_sign_flip' must be true or false"):
        _laplacian_model(pe_sign_flip="yes")
