"""Models: the hybrid layer, the stacked graph transformer, the anchors and the registry. The papers'
own model presets live with their mechanisms (``graphattn.producers.samsa.model``,
``graphattn.producers.converter.model``) and register here by name."""

from graphattn._lazy import install_moved_modules
from graphattn.nn.base import GraphModel
from graphattn.nn.dropout import Dropout
from graphattn.nn.edge_gcn import EdgeGCNConv
from graphattn.nn.hybrid import HybridLayer
from graphattn.nn.model import GraphTransformer, positional_encoding
from graphattn.nn.registry import MODELS, create_model, get_model, model_options, register_model

# the anchors and the mechanism presets (they register themselves by name)
from graphattn.nn import baselines, gcn_plus, gcn_plus_attention, propagation  # noqa: F401  isort: skip
import graphattn.producers.converter.model  # isort: skip
import graphattn.producers.samsa.model  # noqa: F401  isort: skip

#: the presets moved beside their mechanisms; the old paths warn until the next release
MOVED_MODULES = {"graphattn.nn.samsa": "graphattn.producers.samsa.model",
                 "graphattn.nn.converter": "graphattn.producers.converter.model"}
install_moved_modules(MOVED_MODULES)

__all__ = ["MODELS", "Dropout", "EdgeGCNConv", "GraphModel", "GraphTransformer", "HybridLayer",
           "create_model", "get_model", "model_options", "positional_encoding", "register_model"]
