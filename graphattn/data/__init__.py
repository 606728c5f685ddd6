"""Data sets (offline, md5-verified), the ListOps generator, UCR/UEA time series bundled with sktime,
and loaders that turn sequences (tokens or real-valued series), images and point clouds into
graphs."""

from graphattn.data.fashion_mnist import FashionMNIST
from graphattn.data.listops import ListOps
from graphattn.data.loaders import ImageToGraph, PointCloudToGraph, SequenceToGraph, morton_order
from graphattn.data.peptides import PeptidesFunctional, PeptidesStructural
from graphattn.data.planetoid import Planetoid
from graphattn.data.shapes import GeometricShapes
from graphattn.data.store import (
    CorruptedDataError,
    DamagedCacheError,
    MissingDataError,
    RebuiltCacheWarning,
    UnreadableDataError,
    data_root,
    fetch,
    md5sum,
    mirror_root,
    registry,
)
from graphattn.data.tu import TUDataset
from graphattn.data.ucr import UCRDataset

__all__ = [
    "CorruptedDataError",
    "DamagedCacheError",
    "FashionMNIST",
    "GeometricShapes",
    "ImageToGraph",
    "ListOps",
    "MissingDataError",
    "PeptidesFunctional",
    "PeptidesStructural",
    "Planetoid",
    "PointCloudToGraph",
    "RebuiltCacheWarning",
    "SequenceToGraph",
    "TUDataset",
    "UCRDataset",
    "UnreadableDataError",
    "data_root",
    "fetch",
    "md5sum",
    "mirror_root",
    "morton_order",
    "registry",
]
