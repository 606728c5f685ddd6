"""The model registry builds each model from the options it declares (``OPTIONS``), refusing any
other with an error naming the option and the model; the runner passes the options a user chose
and, of the others, those the model takes. The models with an encoder and a read-out share one
path (:class:`~graphattn.nn.base.GraphModel`)."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from graphattn.core.index import default_batch
from graphattn.nn import MODELS, GraphModel, GraphTransformer, create_model, model_options, register_model
from graphattn.nn.gcn_plus_attention import GlobalBranch
from graphattn.nn.hybrid import HybridLayer, attention_branch
from graphattn.nn.registry import check_model_options
from graphattn.runner.build import build_model
from graphattn.runner.config import resolve_config
from graphattn.runner.tasks import Task
from tests.helpers import make_batch


def constructor_options(cls: type) -> set[str]:
    """The keyword arguments ``cls(...)`` takes (through ``**kwargs`` to its base class)."""
    params = inspect.signature(cls.__init__).parameters
    names = {n for n, p in params.items() if n != "self" and p.kind is not p.VAR_KEYWORD}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        names |= constructor_options(cls.__mro__[1])
    return names


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_declares_exactly_the_options_its_constructor_takes(name):
    assert set(MODELS[name].OPTIONS) == constructor_options(MODELS[name])
    assert model_options(name) == frozenset(MODELS[name].OPTIONS)


def test_an_option_a_model_does_not_take_is_refused_by_name():
    with pytest.raises(ValueError, match=r"the 'converter' model \(ConverterModel\) does not use "
                                         r"'heads', 'norm': leave them unset"):
        create_model("converter", hidden_channels=8, out_channels=2, heads=2, norm="layer_norm")
    with pytest.raises(ValueError, match="does not use 'colour'"):
        check_model_options("hybrid", {"hidden_channels": 8, "colour": "red"})
    with pytest.raises(ValueError, match="unknown model 'gpt'"):
        create_model("gpt", hidden_channels=8)
    model = create_model("converter", hidden_channels=8, out_channels=2)  # the rest left out
    assert model.layers[0].channels == 8


def test_check_names_where_each_refused_option_was_set():
    with pytest.raises(ValueError, match=r"'heads' \(set here\)"):
        check_model_options("converter", {"heads": 2}, {"heads": "set here"})


def test_a_registered_model_must_declare_its_options():
    class NoOptions(nn.Module):
        pass

    with pytest.raises(TypeError, match="OPTIONS"):
        register_model("no-options")(NoOptions)
    assert "no-options" not in MODELS

    class Mine(GraphTransformer):  # a subclass inherits GraphTransformer's options
        pass

    try:
        register_model("mine")(Mine)
        assert model_options("mine") == model_options("hybrid")
    finally:
        MODELS.pop("mine", None)


def test_the_models_with_an_encoder_and_a_read_out_share_one_path():
    for name in ("hybrid", "samsa", "converter", "gcnplus", "gcnplus_attention"):
        cls = MODELS[name]
        assert issubclass(cls, GraphModel), name
        for method in ("forward", "encode", "encode_with_batch", "read_out"):
            assert getattr(cls, method) is getattr(GraphModel, method) or name == "converter", \
                (name, method)


def test_default_batch_is_one_graph():
    batch = torch.tensor([0, 0, 1])
    assert default_batch(batch, 3, "cpu") is batch
    ones = default_batch(None, 4, "cpu")
    assert ones.dtype == torch.long and torch.equal(ones, torch.zeros(4, dtype=torch.long))


def test_global_branch_is_the_hybrid_layers_branch():
    branch = GlobalBranch(8, 4, 2, "full", 0.0, None, None, None)
    producer, attn = attention_branch(8, 4, 2, "full")
    assert type(branch.producer) is type(producer) and repr(branch.attn) == repr(attn)
    assert [(n, p.shape) for n, p in branch.attn.named_parameters()] == \
        [(n, p.shape) for n, p in attn.named_parameters()]
    layer = HybridLayer(8, producer="full", heads=2)
    assert GlobalBranch.attend is layer.attend.__func__  # the same attention call
    # a producer that fixes the head size (Sliceformer: one channel per head) gets its heads
    branch = GlobalBranch(8, 4, 2, "sliceformer", 0.0, None, None, None)
    assert branch.attn.heads == 4 and branch.attn.out_channels == 1


def _task(level: str = "graph") -> Task:
    return Task(name="toy", level=level, modality="graph", loss="ce", metric="accuracy",
                out_channels=2, model_defaults={"node_encoder": "linear", "pool": "mean"})


def test_the_runner_refuses_an_option_the_user_set_and_the_model_does_not_take():
    cfg = resolve_config({"task": "mutag", "model": "converter", "conv": "none",
                          "producer": "converter", "hidden": 16, "heads": 2})
    with pytest.raises(ValueError, match=r"'converter' model .* does not use 'heads' \(set by --heads\)"):
        build_model(cfg, _task())
    cfg = resolve_config({"task": "mutag", "model": "converter", "conv": "none",
                          "producer": "converter", "hidden": 16, "model_kwargs": {"colour": 1}})
    with pytest.raises(ValueError, match=r"does not use 'colour' \(in --model-kwargs\)"):
        build_model(cfg, _task())
    # left at the runner's (heads, norm, ...) or the task's (conv, ...) defaults: not passed
    cfg = resolve_config({"task": "mutag", "model": "gcnplus", "hidden": 16, "layers": 2,
                          "node_encoder": "linear"})
    model = build_model(cfg, _task())
    data = make_batch([3, 4], channels=5, dtype=torch.float32, seed=0)
    assert model(data).shape == (2, 2)
