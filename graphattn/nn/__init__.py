"""Models: the hybrid layer, the stacked graph transformer, mechanism presets, and the registry."""

from graphattn.nn.base import GraphModel
from graphattn.nn.dropout import Dropout
from graphattn.nn.edge_gcn import EdgeGCNConv
from graphattn.nn.hybrid import HybridLayer
from graphattn.nn.model import GraphTransformer, positional_encoding
from graphattn.nn.registry import MODELS, create_model, get_model, model_options, register_model

# mechanism presets and the anchors (they register themselves by name)
from graphattn.nn import baselines, converter, gcn_plus, gcn_plus_attention, propagation, samsa  # noqa: F401  isort: skip

__all__ = ["MODELS", "Dropout", "EdgeGCNConv", "GraphModel", "GraphTransformer", "HybridLayer",
           "create_model", "get_model", "model_options", "positional_encoding", "register_model"]
