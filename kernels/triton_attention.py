r"""Triton kernels of the fused sparse attention (CUDA; the CPU only through ``TRITON_INTERPRET=1``).

Same operators and math as the C++ extension (see :mod:`.fused`): one program per (target row,
head) for the forward and the destination pass of the backward, one per (source row, head) for the
source pass. Each program loops over its edges in chunks of ``BLOCK_E``, gathering ``BLOCK_E`` key
(value) rows of ``D`` channels at once, and keeps the online-softmax state ``m`` (running maximum),
``l`` (running sum) and ``acc`` (running weighted sum of values) in registers, rescaling once per
chunk. Exponentials are base 2 with :math:`\log_2 e` folded into the scale. Storage may be fp16,
bf16, fp32 or fp64; arithmetic is fp32 (fp64 for fp64 inputs), and ``lse`` is kept in fp32 (fp64).

* ``_forward_kernel``: ``out``, ``lse`` (``-inf`` for rows without edges, whose output is 0).
* ``_backward_dst_kernel``: ``Dterm = dO·o``, ``dq``, and ``ds`` / ``p·g`` per (edge, head) into
  ``[E, H]`` buffers when ``bias`` / ``weight`` need gradients (reduced over heads by torch for
  ``[E]`` fields).
* ``_backward_src_kernel``: ``dk``, ``dv`` over the CSC, recomputing ``p`` and ``ds`` from the
  gathered ``q_i``, ``dO_i``, ``lse_i``, ``Dterm_i``.
* ``_probs_kernel``: the softmax coefficients ``p [E, H]`` given ``lse``.

Optional edge features ``f [E, H, D]`` (``HAS_EF``; read by edge id like bias and weight) are added
to the keys and values, ``s_e = scale·q_i·(k_j + f_e) + b_e``, ``o_i = Σ p_e w_e (v_j + f_e)``; the
destination pass also writes their gradient ``df_e = scale·ds_e·q_i + p_e w_e dO_i`` (weighted mode:
``w_e dO_i``), once per (edge, head) by the program of the edge's row. ``q_i·f_e`` is a separate
dot product in every pass, so that the forward's ``lse`` and the recomputed logits agree.

No atomics anywhere, so results are deterministic. Heavy rows are not split across programs (a
row of degree d costs d / BLOCK_E sequential steps in one program).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

# exp(x) = 2^(x·log2 e): the kernels work in base 2 (constexpr: folded into the compiled code)
_LOG2E = 1.4426950408889634  # host side (folded into the scale)
LOG2E: tl.constexpr = tl.constexpr(_LOG2E)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


@triton.jit
def _program_row(SCALES, PTR, H, D, BLOCK_D: tl.constexpr):
    """The program's row (axis 0: a target row, or a source row in the source pass) and head
    (axis 1): ``(row, h, qk_scale, scale, start, end, offs_d, dmask, base)`` with the scales (see
    :func:`_scales`), the row's entries ``start .. end - 1`` (``PTR[row] .. PTR[row + 1]``), the
    channel offsets and mask, and ``base``, the offsets of the row's head-``h`` slice of an
    ``[rows, H, D]`` tensor."""
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    qk_scale = tl.load(SCALES)
    scale = tl.load(SCALES + 1)
    start = tl.load(PTR + row)
    end = tl.load(PTR + row + 1)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    base = row * (H * D) + h * D + offs_d
    return row, h, qk_scale, scale, start, end, offs_d, dmask, base


@triton.jit
def _edge_chunk(IDX, EID, e0, end, h, H, D, offs_d, dmask, BLOCK_E: tl.constexpr):
    """The chunk of a row's entries ``e0 .. e0 + BLOCK_E - 1`` (those before ``end``):
    ``(emask, j, uid, tile, tmask)``, the entries' mask, the row each gathers (``IDX``: the source
    row, or the target row in the source pass), its edge id (``EID``), and the offsets and mask of
    the ``[BLOCK_E, BLOCK_D]`` tile of the gathered rows' head-``h`` slices."""
    offs_e = e0 + tl.arange(0, BLOCK_E)
    emask = offs_e < end
    j = tl.load(IDX + offs_e, mask=emask, other=0).to(tl.int64)
    uid = tl.load(EID + offs_e, mask=emask, other=0).to(tl.int64)
    tile = j[:, None] * (H * D) + h * D + offs_d[None, :]
    tmask = emask[:, None] & dmask[None, :]
    return emask, j, uid, tile, tmask


@triton.jit
def _edge_values(F, uid, h, se, sh, emask, ACC: tl.constexpr):
    """A per-edge field (bias or weight: ``[E]`` or ``[E, H]`` by its strides) at the chunk's
    edges in head ``h`` (0 at masked entries)."""
    return tl.load(F + uid * se + h * sh, mask=emask, other=0.0).to(ACC)


@triton.jit
def _feature_tile(EF, uid, h, H, D, offs_d, tmask, ACC: tl.constexpr):
    """``(ftile, ft)``: the offsets of the chunk's edges' head-``h`` slices of the ``[E, H, D]`` edge
    features (by edge id) and the loaded tile (0 at masked entries)."""
    ftile = uid[:, None] * (H * D) + h * D + offs_d[None, :]
    return ftile, tl.load(EF + ftile, mask=tmask, other=0.0).to(ACC)


@triton.jit
def _logits(X, tile, tmask, y, qk_scale, BIAS, uid, h, bias_se, bias_sh, emask, ft,
            HAS_BIAS: tl.constexpr, HAS_EF: tl.constexpr, EF_DOT_X: tl.constexpr,
            ACC: tl.constexpr):
    """``(xt, s)``: the gathered tile of ``X`` and the chunk's logits in log2 units,
    ``qk_scale · (x_j·y + q·f_e)`` (plus ``bias · log2 e``), with the edge features' tile ``ft``
    (``HAS_EF``) and the query ``q`` the row ``y`` or, with ``EF_DOT_X`` (source pass), the
    gathered tile ``x``."""
    xt = tl.load(X + tile, mask=tmask, other=0.0).to(ACC)
    s = tl.sum(xt * y[None, :], axis=1)
    if HAS_EF:
        if EF_DOT_X:
            s = s + tl.sum(xt * ft, axis=1)
        else:
            s = s + tl.sum(ft * y[None, :], axis=1)
    s = s * qk_scale
    if HAS_BIAS:
        s = s + _edge_values(BIAS, uid, h, bias_se, bias_sh, emask, ACC) * LOG2E
    return xt, s


@triton.jit
def _forward_kernel(
    Q, K, V, ROWPTR, COL, EID, BIAS, WEIGHT, EF, OUT, LSE,
    H, D, SCALES, bias_se, bias_sh, w_se, w_sh,
    HAS_BIAS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_EF: tl.constexpr, SOFTMAX: tl.constexpr,
    ACC: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
):
    row, h, qk_scale, _scale, start, end, offs_d, dmask, base = _program_row(SCALES, ROWPTR, H, D, BLOCK_D)
    q = tl.load(Q + base, mask=dmask, other=0.0).to(ACC)
    m = tl.full([1], float("-inf"), ACC)
    l = tl.zeros([1], ACC)
    acc = tl.zeros([BLOCK_D], ACC)
    for e0 in range(start, end, BLOCK_E):
        emask, _j, uid, tile, tmask = _edge_chunk(COL, EID, e0, end, h, H, D, offs_d, dmask, BLOCK_E)
        ft = 0.0
        if HAS_EF:
            _ftile, ft = _feature_tile(EF, uid, h, H, D, offs_d, tmask, ACC)
        if SOFTMAX:
            _kt, s = _logits(K, tile, tmask, q, qk_scale, BIAS, uid, h, bias_se, bias_sh, emask, ft,
                             HAS_BIAS, HAS_EF, False, ACC)
            s = tl.where(emask, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            rescale = tl.exp2(m - m_new)
            p = tl.exp2(s - m_new)
            l = l * rescale + tl.sum(p, axis=0)
            acc = acc * rescale
            m = m_new
            c = p
        else:
            c = tl.where(emask, 1.0, 0.0).to(ACC)
        if HAS_WEIGHT:
            c = c * _edge_values(WEIGHT, uid, h, w_se, w_sh, emask, ACC)
        vt = tl.load(V + tile, mask=tmask, other=0.0).to(ACC)
        if HAS_EF:
            vt = vt + ft
        acc += tl.sum(c[:, None] * vt, axis=0)
    if SOFTMAX:
        nonempty = l > 0
        l_safe = tl.where(nonempty, l, 1.0)
        acc = acc / l_safe
        lse = tl.where(nonempty, (m + tl.log2(l_safe)) * LN2, float("-inf"))
    else:
        lse = tl.zeros([1], ACC)
    tl.store(OUT + base, acc.to(OUT.dtype.element_ty), mask=dmask)
    tl.store(LSE + row * H + h + tl.arange(0, 1), lse)


@triton.jit
def _backward_dst_kernel(
    Q, K, V, OUT, DOUT, LSE, ROWPTR, COL, EID, BIAS, WEIGHT, EF, DQ, DS_BUF, PG_BUF, DF, DTERM,
    H, D, SCALES, bias_se, bias_sh, w_se, w_sh,
    HAS_BIAS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_EF: tl.constexpr, SOFTMAX: tl.constexpr,
    NEED_DQ: tl.constexpr, NEED_DS: tl.constexpr, NEED_PG: tl.constexpr, NEED_DF: tl.constexpr,
    ACC: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
):
    row, h, qk_scale, scale, start, end, offs_d, dmask, base = _program_row(SCALES, ROWPTR, H, D, BLOCK_D)
    do = tl.load(DOUT + base, mask=dmask, other=0.0).to(ACC)
    if SOFTMAX:
        o = tl.load(OUT + base, mask=dmask, other=0.0).to(ACC)
        q = tl.load(Q + base, mask=dmask, other=0.0).to(ACC)
        dterm = tl.sum(do * o, axis=0)
        lse2 = tl.load(LSE + row * H + h).to(ACC) * LOG2E
        tl.store(DTERM + row * H + h + tl.arange(0, 1), tl.zeros([1], ACC) + dterm)
    dq = tl.zeros([BLOCK_D], ACC)
    for e0 in range(start, end, BLOCK_E):
        emask, _j, uid, tile, tmask = _edge_chunk(COL, EID, e0, end, h, H, D, offs_d, dmask, BLOCK_E)
        ft = 0.0
        if HAS_EF:
            ftile, ft = _feature_tile(EF, uid, h, H, D, offs_d, tmask, ACC)
        vt = tl.load(V + tile, mask=tmask, other=0.0).to(ACC)
        if HAS_EF:
            vt = vt + ft
        g = tl.sum(vt * do[None, :], axis=1)
        if SOFTMAX:
            kt, s = _logits(K, tile, tmask, q, qk_scale, BIAS, uid, h, bias_se, bias_sh, emask, ft,
                            HAS_BIAS, HAS_EF, False, ACC)
            p = tl.where(emask, tl.exp2(s - lse2), 0.0)
            if HAS_WEIGHT:
                w = _edge_values(WEIGHT, uid, h, w_se, w_sh, emask, ACC)
                ds = p * (w * g - dterm)
            else:
                ds = p * (g - dterm)
            if NEED_DQ:
                if HAS_EF:
                    kt = kt + ft
                dq += tl.sum(ds[:, None] * kt, axis=0) * scale
            if NEED_DS:
                tl.store(DS_BUF + uid * H + h, ds, mask=emask)
            if NEED_PG:
                tl.store(PG_BUF + uid * H + h, p * g, mask=emask)
            if NEED_DF:  # df_e = scale ds_e q_i + p_e w_e dO_i
                if HAS_WEIGHT:
                    pw = p * w
                else:
                    pw = p
                df = (ds * scale)[:, None] * q[None, :] + pw[:, None] * do[None, :]
                tl.store(DF + ftile, df.to(DF.dtype.element_ty), mask=tmask)
        else:
            if NEED_PG:
                tl.store(PG_BUF + uid * H + h, g, mask=emask)
            if NEED_DF:  # df_e = w_e dO_i
                if HAS_WEIGHT:
                    w = _edge_values(WEIGHT, uid, h, w_se, w_sh, emask, ACC)
                    df = w[:, None] * do[None, :]
                else:
                    df = tl.zeros([BLOCK_E, BLOCK_D], ACC) + do[None, :]
                tl.store(DF + ftile, df.to(DF.dtype.element_ty), mask=tmask)
    if NEED_DQ:
        tl.store(DQ + base, dq.to(DQ.dtype.element_ty), mask=dmask)


@triton.jit
def _backward_src_kernel(
    Q, K, V, DOUT, LSE, DTERM, COLPTR, CROW, CUID, BIAS, WEIGHT, EF, DK, DV,
    H, D, SCALES, bias_se, bias_sh, w_se, w_sh,
    HAS_BIAS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_EF: tl.constexpr, SOFTMAX: tl.constexpr,
    NEED_DK: tl.constexpr, NEED_DV: tl.constexpr,
    ACC: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
):
    _src, h, qk_scale, scale, start, end, offs_d, dmask, base = _program_row(SCALES, COLPTR, H, D, BLOCK_D)
    v = tl.load(V + base, mask=dmask, other=0.0).to(ACC)
    if SOFTMAX:
        k = tl.load(K + base, mask=dmask, other=0.0).to(ACC)
    dk = tl.zeros([BLOCK_D], ACC)
    dv = tl.zeros([BLOCK_D], ACC)
    for c0 in range(start, end, BLOCK_E):
        cmask, i, uid, tile, tmask = _edge_chunk(CROW, CUID, c0, end, h, H, D, offs_d, dmask, BLOCK_E)
        dot = tl.load(DOUT + tile, mask=tmask, other=0.0).to(ACC)
        if HAS_WEIGHT:
            w = _edge_values(WEIGHT, uid, h, w_se, w_sh, cmask, ACC)
        else:
            w = tl.where(cmask, 1.0, 0.0).to(ACC)
        if SOFTMAX:
            ft = 0.0
            if HAS_EF:
                _ftile, ft = _feature_tile(EF, uid, h, H, D, offs_d, tmask, ACC)
            qt, s = _logits(Q, tile, tmask, k, qk_scale, BIAS, uid, h, bias_se, bias_sh, cmask, ft,
                            HAS_BIAS, HAS_EF, True, ACC)
            lse2 = tl.load(LSE + i * H + h, mask=cmask, other=0.0).to(ACC) * LOG2E
            p = tl.where(cmask, tl.exp2(s - lse2), 0.0)
            if NEED_DK:
                if HAS_EF:  # g_e = dO_i·(v_j + f_e)
                    g = tl.sum(dot * (v[None, :] + ft), axis=1)
                else:
                    g = tl.sum(dot * v[None, :], axis=1)
                dterm = tl.load(DTERM + i * H + h, mask=cmask, other=0.0).to(ACC)
                ds = p * (w * g - dterm)
                dk += tl.sum(ds[:, None] * qt, axis=0) * scale
            dv += tl.sum((p * w)[:, None] * dot, axis=0)
        else:
            dv += tl.sum(w[:, None] * dot, axis=0)
    if NEED_DK:
        tl.store(DK + base, dk.to(DK.dtype.element_ty), mask=dmask)
    if NEED_DV:
        tl.store(DV + base, dv.to(DV.dtype.element_ty), mask=dmask)


@triton.jit
def _probs_kernel(
    Q, K, LSE, ROWPTR, COL, EID, BIAS, EF, P,
    H, D, SCALES, bias_se, bias_sh,
    HAS_BIAS: tl.constexpr, HAS_EF: tl.constexpr, ACC: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row, h, qk_scale, _scale, start, end, offs_d, dmask, base = _program_row(SCALES, ROWPTR, H, D, BLOCK_D)
    q = tl.load(Q + base, mask=dmask, other=0.0).to(ACC)
    lse2 = tl.load(LSE + row * H + h).to(ACC) * LOG2E
    for e0 in range(start, end, BLOCK_E):
        emask, _j, uid, tile, tmask = _edge_chunk(COL, EID, e0, end, h, H, D, offs_d, dmask, BLOCK_E)
        ft = 0.0
        if HAS_EF:
            _ftile, ft = _feature_tile(EF, uid, h, H, D, offs_d, tmask, ACC)
        _kt, s = _logits(K, tile, tmask, q, qk_scale, BIAS, uid, h, bias_se, bias_sh, emask, ft,
                         HAS_BIAS, HAS_EF, False, ACC)
        tl.store(P + uid * H + h, tl.exp2(s - lse2), mask=emask)


# ------------------------------------------------------------------------------ launchers
BLOCK_E = 32


def _acc(dtype: torch.dtype) -> tuple[torch.dtype, tl.dtype]:
    return (torch.float64, tl.float64) if dtype == torch.float64 else (torch.float32, tl.float32)


def _field(t: Tensor | None, H: int, dummy: Tensor) -> tuple[Tensor, int, int, bool]:
    if t is None:
        return dummy, 0, 0, False
    return (t, 1, 0, True) if t.dim() == 1 else (t, H, 1, True)


def _features(ef: Tensor | None, E: int, ref: Tensor) -> tuple[Tensor, bool]:
    """The edge-feature argument of a kernel and ``HAS_EF`` (``ref`` stands in for absent
    features); the features must be a contiguous ``[E, H, D]`` tensor like ``ref``."""
    if ef is None:
        return ref, False
    if not (ef.dtype == ref.dtype and ef.device == ref.device and ef.is_contiguous()
            and ef.shape == (E, ref.size(1), ref.size(2))):
        raise RuntimeError("graphattn fused: edge features must be a contiguous [E, H, D] tensor "
                           "like v")
    return ef, True


_SCALES: dict[tuple[float, torch.dtype, torch.device], Tensor] = {}


def _scales(scale: float, acc_t: torch.dtype, device: torch.device) -> Tensor:
    """``[scale·log2(e), scale]`` in the accumulation dtype, read by the kernels from memory: a
    Python float argument reaches a compiled kernel as fp32 (the interpreter keeps it a Python
    float), which would round the scale of float64 attention to single precision. Cached per
    (scale, dtype, device): a host-to-device copy from pageable memory on every launch would make
    the host wait for the device."""
    key = (float(scale), acc_t, torch.device(device))
    t = _SCALES.get(key)
    if t is None:
        if len(_SCALES) > 64:
            _SCALES.clear()
        t = _SCALES[key] = torch.tensor([scale * _LOG2E, scale], dtype=acc_t, device=device)
    return t


def _meta(v: Tensor) -> dict:
    return {"BLOCK_E": BLOCK_E, "BLOCK_D": triton.next_power_of_2(max(v.size(2), 1))}


def forward(q, k, v, rowptr, col, eid, bias, weight, scale, softmax, ef=None):
    """``(out [R, H, D], lse [R, H])`` — see :mod:`.fused` (``ef``: optional edge features
    ``[E, H, D]``)."""
    R, H, D = rowptr.numel() - 1, v.size(1), v.size(2)
    f, has_f = _features(ef, col.numel(), v)
    acc_t, acc_tl = _acc(v.dtype)
    out = torch.empty(R, H, D, dtype=v.dtype, device=v.device)
    lse = torch.empty(R, H, dtype=acc_t, device=v.device)
    if R == 0 or H == 0:
        return out, lse
    b, bse, bsh, has_b = _field(bias, H, v)
    w, wse, wsh, has_w = _field(weight, H, v)
    _forward_kernel[(R, H)](
        q, k, v, rowptr, col, eid, b, w, f, out, lse,
        H, D, _scales(scale, acc_t, v.device), bse, bsh, wse, wsh,
        HAS_BIAS=has_b, HAS_WEIGHT=has_w, HAS_EF=has_f, SOFTMAX=softmax, ACC=acc_tl, **_meta(v),
    )
    return out, lse


def backward_dst(q, k, v, out, dout, lse, rowptr, col, eid, bias, weight, scale, softmax,
                 need_dq, need_dbias, need_dweight, ef=None, need_def=False):
    """``(dq, dbias, dweight, dterm, def)`` — see :mod:`.fused` (``def``, the gradient of the edge
    features ``ef``, only with ``need_def``; else ``None``)."""
    R, H, D, E = rowptr.numel() - 1, v.size(1), v.size(2), col.numel()
    acc_t, acc_tl = _acc(v.dtype)
    f, has_f = _features(ef, E, v)
    need_dq = need_dq and softmax
    need_ds = need_dbias and bias is not None and softmax
    need_pg = need_dweight and weight is not None
    need_df = need_def and has_f
    dq = torch.empty(R, H, D, dtype=v.dtype, device=v.device) if need_dq else None
    ds_buf = torch.zeros(E, H, dtype=acc_t, device=v.device) if need_ds else None
    pg_buf = torch.zeros(E, H, dtype=acc_t, device=v.device) if need_pg else None
    # each edge's df_e is written by its row's program (zeros as on the CPU: an edge in no row)
    df = torch.zeros_like(f) if need_df else None
    dterm = torch.zeros(R, H, dtype=acc_t, device=v.device)
    if R > 0 and H > 0:
        b, bse, bsh, has_b = _field(bias, H, v)
        w, wse, wsh, has_w = _field(weight, H, v)
        _backward_dst_kernel[(R, H)](
            q, k, v, out, dout, lse, rowptr, col, eid, b, w, f,
            dq if need_dq else v, ds_buf if need_ds else dterm, pg_buf if need_pg else dterm,
            df if need_df else v, dterm,
            H, D, _scales(scale, acc_t, v.device), bse, bsh, wse, wsh,
            HAS_BIAS=has_b, HAS_WEIGHT=has_w, HAS_EF=has_f, SOFTMAX=softmax,
            NEED_DQ=need_dq, NEED_DS=need_ds, NEED_PG=need_pg, NEED_DF=need_df, ACC=acc_tl,
            **_meta(v),
        )
    dbias = _reduce(ds_buf, bias)
    dweight = _reduce(pg_buf, weight)
    return dq, dbias, dweight, dterm, df


def _reduce(buf: Tensor | None, field: Tensor | None) -> Tensor | None:
    """``[E, H]`` per-(edge, head) gradient → the field's shape (summed over heads for ``[E]``)."""
    if buf is None or field is None:
        return None
    return (buf.sum(1) if field.dim() == 1 else buf).to(field.dtype)


def backward_src(q, k, v, dout, lse, dterm, colptr, crow, cuid, bias, weight, scale, softmax,
                 need_dk, need_dv, ef=None):
    """``(dk, dv)`` — see :mod:`.fused` (``ef``: optional edge features ``[E, H, D]``)."""
    S, H, D = colptr.numel() - 1, v.size(1), v.size(2)
    f, has_f = _features(ef, crow.numel(), v)
    acc_t, acc_tl = _acc(v.dtype)
    need_dk = need_dk and softmax
    dk = torch.empty_like(v) if need_dk else None
    dv = torch.empty_like(v) if need_dv else None
    if (need_dk or need_dv) and S > 0 and H > 0:
        b, bse, bsh, has_b = _field(bias, H, v)
        w, wse, wsh, has_w = _field(weight, H, v)
        _backward_src_kernel[(S, H)](
            q, k, v, dout, lse, dterm, colptr, crow, cuid, b, w, f,
            dk if need_dk else v, dv if need_dv else v,
            H, D, _scales(scale, acc_t, v.device), bse, bsh, wse, wsh,
            HAS_BIAS=has_b, HAS_WEIGHT=has_w, HAS_EF=has_f, SOFTMAX=softmax, NEED_DK=need_dk,
            NEED_DV=need_dv, ACC=acc_tl, **_meta(v),
        )
    return dk, dv


def probs(q, k, lse, rowptr, col, eid, bias, scale, ef=None):
    """Softmax coefficients ``[E, H]`` in edge-set order — see :mod:`.fused` (``ef``: optional
    edge features ``[E, H, D]``)."""
    R, H, D, E = rowptr.numel() - 1, q.size(1), q.size(2), col.numel()
    acc_t, acc_tl = _acc(q.dtype)
    f, has_f = _features(ef, E, q)
    p = torch.zeros(E, H, dtype=q.dtype, device=q.device)
    if R > 0 and H > 0:
        b, bse, bsh, has_b = _field(bias, H, q)
        _probs_kernel[(R, H)](
            q, k, lse, rowptr, col, eid, b, f, p, H, D, _scales(scale, acc_t, q.device), bse, bsh,
            HAS_BIAS=has_b, HAS_EF=has_f, ACC=acc_tl, **_meta(q),
        )
    return p
