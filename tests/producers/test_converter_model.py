"""The Converter preset: complex-valued attention, gated FFN, ScaleNorm, the block and the model
(specs/converter.md T11 full-block gradients and T12 shapes and dtypes)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import tomllib
import torch

from graphattn.nn import MODELS, create_model, get_model
from graphattn.producers.converter import ConverterProducer
from graphattn.producers.converter.kernelution import kernel_polynomial_loss
from graphattn.producers.converter.model import (
    ComplexValueAttention,
    ConverterBlock,
    ConverterModel,
    GatedFFN,
    RecurrentPositionalEncoding,
    ScaleNorm,
)
from graphattn.runner.config import resolve_config
from tests.helpers import make_batch

ROOT = Path(__file__).resolve().parents[2]
F64, C128 = torch.float64, torch.complex128


def test_scale_norm_real_and_complex():
    norm = ScaleNorm(3).double()
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 3.0]))
    z = torch.tensor([[3 + 4j, 0j, 0j], [1j, 1 + 0j, 1j]], dtype=C128)
    out = norm(z)
    assert out.is_complex()
    # ‖z‖ = sqrt(Σ|z|²): 5 for the first row, √3 for the second
    assert torch.allclose(out[0], torch.tensor([(3 + 4j) / (5 + 1e-5), 0, 0], dtype=C128))
    assert torch.allclose(out[1], torch.tensor([1j, 2, 3j], dtype=C128) / (math.sqrt(3) + 1e-5))
    x = torch.randn(4, 3, dtype=F64)
    fix = ScaleNorm(3, affine=False).double()
    assert fix.weight is None
    assert torch.allclose(torch.linalg.vector_norm(fix(x), dim=-1), torch.ones(4, dtype=F64), atol=1e-4)


def test_gated_ffn_formula():
    ffn = GatedFFN(4, 6).double()
    z = torch.randn(5, 4, dtype=C128)
    want = ffn.lin_out(torch.nn.functional.softplus(ffn.lin_re(z.real), threshold=5.0)
                       * torch.tanh(ffn.lin_im(z.imag)))
    out = ffn(z)
    assert not out.is_complex() and torch.allclose(out, want)


def test_rpe_runs_per_graph():
    torch.manual_seed(0)
    rpe = RecurrentPositionalEncoding(5, num_layers=2).double().eval()
    batch = make_batch([4, 0, 2, 3], channels=5)
    out = rpe(batch.x, batch.batch)
    for g in (0, 2, 3):
        s, e = int(batch.ptr[g]), int(batch.ptr[g + 1])
        alone = rpe(batch.x[s:e], torch.zeros(e - s, dtype=torch.long))
        assert torch.allclose(out[s:e], alone, atol=1e-12)
    # causal in node order: changing the last node of a graph leaves its earlier nodes unchanged
    x = batch.x.clone()
    x[3] += 1
    out2 = rpe(x, batch.batch)
    assert torch.equal(out2[:3], out[:3]) and not torch.equal(out2[3], out[3])
    assert rpe(batch.x[:0], batch.batch[:0]).shape == (0, 5)


def test_complex_value_attention_fast_equals_reference():
    """The operator fast path with complex values == the explicit re/im path on S's edges."""
    batch = make_batch([5, 1, 7], channels=6, seed=1)
    prod = ConverterProducer(6).double()
    fast = ComplexValueAttention(6).double()
    ref = ComplexValueAttention(6, kernel="reference").double()
    ref.load_state_dict(fast.state_dict())
    x1, x2 = batch.x.clone().requires_grad_(), batch.x.clone().requires_grad_()
    o1 = fast(x1, prod, batch.batch)
    o2 = ref(x2, prod, batch.batch)
    assert o1.is_complex() and o1.shape == (13, 6)
    assert (o1 - o2).abs().max() < 1e-12
    S = prod(batch.x, batch.batch).to_dense()
    v = torch.complex(fast.lin_value(batch.x), fast.lin_value_imag(batch.x))
    assert (o1 - S @ v).abs().max() < 1e-12  # S (V_re + i V_im)
    w = torch.randn(o1.shape, dtype=C128, generator=torch.Generator().manual_seed(0))
    params = [fast.lin_value.weight, fast.lin_value_imag.weight]
    g1 = torch.autograd.grad((o1 * w).real.sum(), [x1, *params])
    g2 = torch.autograd.grad((o2 * w).real.sum(), [x2, ref.lin_value.weight, ref.lin_value_imag.weight])
    for a, b in zip(g1, g2, strict=True):
        assert (a - b).abs().max() < 1e-11
    names = {n for n, _ in fast.named_parameters()}
    assert names == {"lin_value.weight", "lin_value_imag.weight"}  # no bias, no query / key
    with pytest.raises(ValueError, match="value_dropout"):
        ComplexValueAttention(6, value_dropout=1.5)


def test_block_shapes_dtypes_and_zeta():
    batch = make_batch([4, 1, 0, 6], channels=8, dtype=torch.float32)
    block = ConverterBlock(8, {"name": "converter", "order": 3})
    out = block(batch.x, batch=batch.batch)
    assert out.dtype == torch.float32 and out.shape == (11, 8) and torch.isfinite(out).all()
    assert block.last_edges.structure == "operator"
    # ScaleNorm at the end with g = 1 at initialisation: every row has unit norm
    assert torch.allclose(torch.linalg.vector_norm(out, dim=-1), torch.ones(11), atol=1e-3)
    with torch.no_grad():  # ζ is clamped to [0, 1]: 1.7 acts as 1, -0.3 as 0
        block.zeta.fill_(1.7)
        hi = block.eval()(batch.x, batch=batch.batch)
        block.zeta.fill_(1.0)
        one = block(batch.x, batch=batch.batch)
        block.zeta.fill_(-0.3)
        lo = block(batch.x, batch=batch.batch)
        block.zeta.fill_(0.0)
        zero = block(batch.x, batch=batch.batch)
    assert torch.equal(hi, one) and torch.equal(lo, zero) and not torch.equal(one, zero)
    with pytest.raises(ValueError, match="'converter' producer"):
        ConverterBlock(8, "full")


def _model(**kw):
    args = dict(hidden_channels=16, out_channels=3, num_layers=1,
                producer={"name": "converter", "dropout": 0.1}, dropout=0.1, head_layers=2,
                node_encoder="linear")
    args.update(kw)
    return get_model("converter")(**args)


def test_every_parameter_gets_a_finite_nonzero_gradient():
    torch.manual_seed(0)
    batch = make_batch([7, 1, 3, 5], channels=8, dtype=torch.float32)
    model = _model()
    out = model(batch)
    aux = model.aux_loss()
    loss = torch.nn.functional.cross_entropy(out, torch.tensor([0, 1, 2, 0])) + aux
    loss.backward()
    names = dict(model.named_parameters())
    for needed in ("rpe.gru.weight_hh_l1", "layers.0.producer.eigvec_siren.lin1.weight",
                   "layers.0.producer.eigval_siren.norm.weight", "layers.0.producer.cheb_weight",
                   "layers.0.attn.lin_value.weight", "layers.0.attn.lin_value_imag.weight",
                   "layers.0.gffn.lin_im.weight", "layers.0.norm_z.weight", "layers.0.zeta",
                   "layers.0.norm_out.weight", "rpe.norm.weight"):
        assert needed in names, needed
    for name, p in names.items():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    prod = model.layers[0].producer
    assert torch.allclose(aux, 1e-3 * kernel_polynomial_loss(prod.cheb_weight))


def test_model_registry_options_and_batch_independence():
    assert MODELS["converter"] is ConverterModel
    model = _model(readout="mean", rpe=False).eval()
    assert model.pool == "mean" and model.rpe is None
    batch = make_batch([5, 2, 6], channels=8, dtype=torch.float64, seed=3)
    model = model.double()
    out = model(batch)
    for g, data in enumerate(batch.to_data_list()):
        data.batch = torch.zeros(data.num_nodes, dtype=torch.long)
        data.num_graphs = 1
        assert torch.allclose(model(data)[0], out[g], atol=1e-12)
    out_t, trace = model(batch, trace_attention=True)
    assert torch.allclose(out_t, out) and len(trace.records) == 1
    assert trace.records[0].alpha.is_complex()
    with pytest.raises(ValueError, match="local conv"):
        _model(conv="gcn")
    with pytest.raises(ValueError, match="readout"):
        _model(readout="median")
    with pytest.raises(ValueError, match="head_layers"):
        _model(head_layers=0)
    with pytest.raises(ValueError, match="'converter' producer"):
        _model(producer="window")


def test_example_config_builds_the_preset():
    cfg_file = ROOT / "examples" / "configs" / "converter_listops.toml"
    raw = tomllib.loads(cfg_file.read_text())
    cfg = resolve_config(raw)
    assert cfg["model"] == "converter" and cfg["producer"]["name"] == "converter"
    model = get_model(cfg["model"])(hidden_channels=cfg["hidden"], out_channels=10,
                                     num_layers=cfg["layers"], producer=cfg["producer"],
                                     node_encoder="embedding", num_embeddings=20,
                                     ffn_ratio=cfg["ffn_ratio"], head_layers=cfg["head_layers"],
                                     act=cfg["act"], pool="cls", **cfg["model_kwargs"])
    assert model.pool == "mean"
    assert model.layers[0].gffn.lin_re.out_features == cfg["ffn_ratio"] * cfg["hidden"]


@pytest.mark.parametrize("arg", [{"heads": 8}, {"norm": "batch_norm"}, {"norm_first": True},
                                 {"residual": False}, {"ffn": False}, {"attn_dropout": 0.1},
                                 {"edge_encoder": "bond"}])
def test_preset_refuses_arguments_it_does_not_use(arg):
    name = next(iter(arg))
    with pytest.raises(ValueError, match=f"'converter' model .* does not use '{name}'"):
        create_model("converter", hidden_channels=16, out_channels=2, **arg)
    with pytest.raises(TypeError, match=f"'{name}'"):
        ConverterModel(16, 2, **arg)
    # an option left out is not given: the preset builds
    create_model("converter", hidden_channels=16, out_channels=2)
