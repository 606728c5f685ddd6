"""Models: the hybrid layer, the stacked graph transformer and their building blocks."""

from graphattn.nn.hybrid import HybridLayer
from graphattn.nn.model import GraphTransformer, positional_encoding

__all__ = ["GraphTransformer", "HybridLayer", "positional_encoding"]
