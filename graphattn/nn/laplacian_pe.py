"""Laplacian eigenvector encoding, computed deterministically."""

from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform
from torch_geometric.utils import get_laplacian, to_scipy_sparse_matrix

#: below this many nodes the spectrum is computed densely (``numpy.linalg.eigh``), as PyG does
DENSE_BELOW = 100


class LaplacianPE(BaseTransform):
    r"""The :math:`k` eigenvectors of the symmetric normalised Laplacian
    :math:`L = I - D^{-1/2} A D^{-1/2}` with the smallest eigenvalues after the first, as node
    features (PyG's :class:`~torch_geometric.transforms.AddLaplacianEigenvectorPE` for undirected
    graphs, made reproducible).

    PyG's transform starts ARPACK from a random vector and flips each eigenvector's sign with torch's
    global generator, so the same graph gets another encoding in every process (and, on a graph with
    several components, where the eigenvalue 0 repeats, another basis of its eigenspace). Here the
    solver starts from a fixed vector (a seeded uniform draw) and each eigenvector's sign is fixed so
    that its entry of largest magnitude is positive: the same graph gets the same encoding, bit for bit,
    in every process on one machine. With canonical signs a model needs no random sign flip in
    training (``GraphTransformer(pe_sign_flip=True)`` still offers GraphGPS's augmentation, for
    eigenvectors of arbitrary sign).
    A graph with :math:`n \le k` nodes has only :math:`n - 1` such eigenvectors; the remaining columns
    are zero.

    Args:
        k (int): the number of eigenvectors :math:`k` (columns of the encoding).
        attr_name (str): the node attribute written.
    """

    def __init__(self, k: int, attr_name: str = "laplacian_eigenvector_pe") -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"'k' must be a positive int, got {k!r}")
        if not isinstance(attr_name, str) or not attr_name:
            raise ValueError(f"'attr_name' must be an attribute name, got {attr_name!r}")
        self.k = k
        self.attr_name = attr_name

    def forward(self, data: Data) -> Data:
        n = int(data.num_nodes)
        pe = torch.zeros(n, self.k)
        if n > 1:
            vectors = self.eigenvectors(data, n)
            pe[:, :vectors.shape[1]] = torch.from_numpy(vectors).float()
        data[self.attr_name] = pe
        return data

    def eigenvectors(self, data: Data, n: int) -> np.ndarray:
        """The eigenvectors 2 … k+1 (by eigenvalue, ties kept in the solver's order) as an
        ``[n, min(k, n - 1)]`` float64 array, each with its largest-magnitude entry positive."""
        ei, w = get_laplacian(data.edge_index, data.get("edge_weight"), normalization="sym",
                              num_nodes=n)
        lap = to_scipy_sparse_matrix(ei, w.double(), n)
        want = min(self.k + 1, n)
        if n < DENSE_BELOW or want >= n - 1:
            values, vectors = np.linalg.eigh(lap.toarray())
        else:
            from scipy.sparse.linalg import eigsh

            start = np.random.default_rng(0).uniform(0.5, 1.5, n)
            values, vectors = eigsh(lap, k=want, which="SA", v0=start)
        order = np.argsort(values, kind="stable")[1:want]
        vectors = vectors[:, order]
        biggest = np.abs(vectors).argmax(axis=0)
        signs = np.sign(vectors[biggest, np.arange(vectors.shape[1])])
        return vectors * np.where(signs == 0, 1.0, signs)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(k={self.k}, attr_name={self.attr_name!r})"
