"""Fast, numerically stable AFT operators (Zhai et al., "An Attention Free Transformer", arXiv:2105.14103).

Every operator computes, for each query position t and channel c,

    Y_t = sigmoid(Q_t) * sum_t' exp(K_t' + w[t, t']) V_t' / sum_t' exp(K_t' + w[t, t'])

with a different structure of the position bias w. The sums are never formed with raw exponentials. Each query
row t gets a shift M_t (per channel or head) that bounds every exponent it sees from above and lies within the bias
range of the largest visible term, so that each exp(.) is at most 1 and the dominant one does not underflow:

* non-causal: M_t = max_t' K_t' + max(0, max_t' w[t, t']) (the global key maximum is visible to every row);
* causal: M_t = cummax_{t' <= t} K_t' + max(0, max_t' w[t, t']). Prefix sums under a running maximum are formed
  by a log-depth scan whose decay factors exp(m_t' - m_t) never exceed 1 (see :func:`_decay_scan`), so keys
  that are tiny at the start and huge later are handled exactly, where a single global shift would underflow.

Methods:

* ``aft_local`` and causal ``aft_simple`` (per-channel keys): the blocked engine of :mod:`aft_hub.ops._band`.
  Rows are cut into blocks of 32-64; the band and the keys next to it are a few batched (L x L) matrix products
  per block, the keys further away (bias 0) one carried sum per block. In causal mode every shift a row uses
  depends on earlier keys only (outputs are bit-for-bit independent of later inputs): a block's own keys are
  taken relative to the running maximum at its first row, earlier blocks relative to their own maxima. Rows whose
  running key maximum rises more than ``_band.CAP`` (60 in float32) inside their block are recomputed on the exact
  loop path: prefix sums by :func:`_decay_scan` and the band by :class:`_BandSum`, one elementwise pass per band
  offset with the per-pair decay exp(m_t' - m_t).
* non-causal ``aft_simple``: one weighted sum per channel (:class:`_SimpleGlobal`).
* ``aft_conv1d`` (per-head keys): prefix/suffix sums (or :func:`_decay_scan`) for the keys outside the kernel,
  :class:`_BandSum` for the kernel.
* ``aft_full``: matrix products (see its docstring); ``aft_conv2d``: a depthwise convolution plus box sums.

Sums outside a local window or kernel are never obtained as "total minus window" (that cancels catastrophically
when the window holds most of the mass and its bias is negative): they are built from prefix and suffix sums of
positive terms. Shifts are detached from the autograd graph: the result does not depend on them. The custom
autograd Functions save only their inputs (and per-block or per-channel summaries) and recompute the rest in the
backward pass, which applies the transposed operation; memory stays O(T * C) (plus O(T * window) for the bias).

Computation is in float32 (float64 when an input is float64); outputs have the dtype of ``q``.
Shapes: q, k, v are (B, T, C) unless stated otherwise; ``key_mask`` is (B, T) bool with False for keys that take no
part (padding). Rows that see no key produce 0. ``pos_bias`` of ``aft_full`` and ``aft_local`` may be (T, T) or
batched (B, T, T) (one bias matrix per batch row, e.g. for left-padded batches).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _band

__all__ = ["aft_full", "aft_simple", "aft_local", "aft_conv1d", "aft_conv2d"]


# ----------------------------------------------------------------------------------------------------------------
# validation and small helpers
# ----------------------------------------------------------------------------------------------------------------


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _check_tensor(name: str, x, ndim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}.")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}.")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}.")


def _check_qkv(q, k, v, key_channels: int | None = None) -> tuple[int, int, int]:
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, x, 3)
    B, T, C = q.shape
    if v.shape != q.shape:
        raise ValueError(f"v must have the shape of q {tuple(q.shape)}, got {tuple(v.shape)}.")
    expected_k = (B, T, C if key_channels is None else key_channels)
    if tuple(k.shape) != expected_k:
        raise ValueError(f"k must have shape {expected_k}, got {tuple(k.shape)}.")
    if T == 0:
        raise ValueError("The sequence is empty (T = 0).")
    return B, T, C


def _check_key_mask(key_mask, B: int, T: int) -> torch.Tensor | None:
    if key_mask is None:
        return None
    if not isinstance(key_mask, torch.Tensor):
        raise TypeError(f"key_mask must be a torch.Tensor of bools, got {type(key_mask).__name__}.")
    if key_mask.dtype != torch.bool:
        raise TypeError(f"key_mask must have dtype torch.bool (True = key takes part), got {key_mask.dtype}.")
    if tuple(key_mask.shape) != (B, T):
        raise ValueError(f"key_mask must have shape (batch, seq_len) = {(B, T)}, got {tuple(key_mask.shape)}.")
    return key_mask


def _fill_masked_keys(k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Replace masked keys (mask (B, T) False) of k (B, T, H) by the smallest valid key of their channel.

    The replaced keys never raise a maximum; their exponentials are multiplied by 0 afterwards.
    """
    if mask is None:
        return k
    m = mask.unsqueeze(-1)
    low = torch.where(m, k, torch.full_like(k, float("inf"))).amin(dim=1, keepdim=True)
    low = torch.where(torch.isfinite(low), low, torch.zeros_like(low)).detach()
    return torch.where(m, k, low)


def _safe_divide(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den with rows of zero denominator (no visible key) giving 0."""
    tiny = torch.finfo(den.dtype).tiny
    return num / den.clamp_min(tiny)


def _shift_forward(x: torch.Tensor, n: int) -> torch.Tensor:
    """out[:, t] = x[:, t - n] along dim 1, zero where t - n < 0 (n >= 0)."""
    T = x.shape[1]
    if n == 0:
        return x
    if n >= T:
        return torch.zeros_like(x)
    return torch.cat([x.new_zeros((x.shape[0], n) + x.shape[2:]), x[:, : T - n]], dim=1)


def _shift_backward(x: torch.Tensor, n: int) -> torch.Tensor:
    """out[:, t] = x[:, t + n] along dim 1, zero where t + n >= T (n >= 0)."""
    T = x.shape[1]
    if n == 0:
        return x
    if n >= T:
        return torch.zeros_like(x)
    return torch.cat([x[:, n:], x.new_zeros((x.shape[0], n) + x.shape[2:])], dim=1)


# ----------------------------------------------------------------------------------------------------------------
# the causal scan: prefix sums under a running maximum
# ----------------------------------------------------------------------------------------------------------------


_SCAN_CHUNK = 16


def _decay_scan(x: torch.Tensor, m: torch.Tensor, reverse: bool) -> torch.Tensor:
    """Decayed scan along dim 1.

    forward: out_t = sum_{t' <= t} exp(m_t' - m_t) x_t';  reverse: out_t = sum_{t' >= t} exp(m_t - m_t') x_t'.
    m must be non-decreasing along dim 1 (broadcastable to x), so every factor is at most 1.

    Chunked: a Hillis-Steele scan inside chunks of 16 positions (4 passes), the same scan over the chunk totals
    (T / 16 positions), then one pass adding each chunk's carry with the exact decay exp(m_chunk_end - m_t) <= 1
    (reverse: exp(m_t - m_next_chunk_start)).
    """
    T = x.shape[1]
    L = _SCAN_CHUNK
    m = m.expand(x.shape[:2] + m.shape[2:])
    if T <= 2 * L:
        out = x.clone()
        _band.hillis_steele(out, m, 1, reverse)
        return out
    nc = -(-T // L)
    pad = nc * L - T
    tail = (0, 0) * (x.dim() - 2)
    if pad:  # padded positions hold x = 0 and repeat the last m, so they change nothing
        out = F.pad(x, tail + (0, pad))
        m = torch.cat([m, m[:, -1:].expand((m.shape[0], pad) + m.shape[2:])], dim=1)
    else:
        out = x.clone()
    oc = out.view((x.shape[0], nc, L) + x.shape[2:])
    mc = m.reshape((m.shape[0], nc, L) + m.shape[2:])
    _band.hillis_steele(oc, mc, 2, reverse)  # within chunks
    if reverse:
        tot = oc[:, :, 0].clone()  # chunk sums relative to m at the chunk start
        ref = mc[:, :, 0]
        _band.hillis_steele(tot, ref, 1, True)  # sums over chunks >= c, relative to m at the start of chunk c
        oc[:, :-1].addcmul_(torch.exp(mc[:, :-1] - ref[:, 1:].unsqueeze(2)), tot[:, 1:].unsqueeze(2))
    else:
        tot = oc[:, :, -1].clone()  # chunk sums relative to m at the chunk end
        ref = mc[:, :, -1]
        _band.hillis_steele(tot, ref, 1, False)  # sums over chunks <= c, relative to m at the end of chunk c
        oc[:, 1:].addcmul_(torch.exp(ref[:, :-1].unsqueeze(2) - mc[:, 1:]), tot[:, :-1].unsqueeze(2))
    return out[:, :T] if pad else out


class _DecayCumsum(torch.autograd.Function):
    """out_t = sum_{t' <= t} exp(m_t' - m_t) x_t', linear in x; m (the running maximum) carries no gradient.

    The backward pass is the transposed scan, so no intermediate of the log(T) steps is kept for autograd.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(m)
        return _decay_scan(x, m, reverse=False)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (m,) = ctx.saved_tensors
        return _decay_scan(grad.contiguous(), m, reverse=True), None


def _decay_cumsum(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return _DecayCumsum.apply(x, m.detach())


# ----------------------------------------------------------------------------------------------------------------
# banded terms: sum over a window of key offsets with per-offset biases, O(T * s * C) time and O(T * C) memory
# ----------------------------------------------------------------------------------------------------------------


def _offset_slices(offset: int, T: int) -> tuple[slice, slice] | None:
    """Query and key ranges along the sequence for keys at t + offset."""
    if abs(offset) >= T:
        return None
    return slice(max(0, -offset), min(T, T - offset)), slice(max(0, offset), min(T, T + offset))


class _BandSum(torch.autograd.Function):
    """Band sums with per-offset biases, multilinear in their inputs (the exact loop path):

        num_t = sum_j F[t, j] c(t, t + o_j) e_{t+o_j} V_{t+o_j},   den_t = sum_j F[t, j] c(t, t + o_j) e_{t+o_j}

    where e = exp(K - ref) * mask (<= 1), F = exp(bias - max bias of the row) (<= 1) and, in causal mode,
    c(t, t') = exp(m_t' - m_t) <= 1 with m the running key maximum (c = 1 otherwise).

    Layout: e (B, T, H); v (B, T, H, D) or (B, T, H) when every head has one channel; F (B or 1, T or 1, J, H or 1);
    m (B, T, H) or None. The loop over the J offsets keeps memory at O(T * H * D) and the backward pass recomputes
    what it needs, so nothing of size O(T * J * C) is ever held.
    """

    @staticmethod
    def forward(ctx, e, v, fb, m, offsets):
        T = e.shape[1]
        per_channel = v.dim() == 3
        num = torch.zeros_like(v)
        den = torch.zeros_like(e)
        ev = e * v if per_channel else e.unsqueeze(-1) * v
        per_row = fb.shape[1] != 1
        for j, off in enumerate(offsets):
            sl = _offset_slices(off, T)
            if sl is None:
                continue
            qs, ks = sl
            f = fb[:, qs, j] if per_row else fb[:, :, j]  # (B or 1, t or 1, H or 1)
            if m is not None:
                f = torch.exp(m[:, ks] - m[:, qs]).mul_(f)  # (B, t, H)
            den[:, qs].addcmul_(e[:, ks], f)
            num[:, qs].addcmul_(ev[:, ks], f if per_channel else f.unsqueeze(-1))
        ctx.save_for_backward(e, v, fb, m)
        ctx.offsets = offsets
        return num, den

    @staticmethod
    def backward(ctx, g_num, g_den):
        e, v, fb, m = ctx.saved_tensors
        T = e.shape[1]
        per_channel = v.dim() == 3
        per_row = fb.shape[1] != 1
        g_num = g_num.contiguous()
        g_den = g_den.contiguous()
        de = torch.zeros_like(e)
        dv = torch.zeros_like(v)
        dfb = torch.zeros_like(fb)
        for j, off in enumerate(ctx.offsets):
            sl = _offset_slices(off, T)
            if sl is None:
                continue
            qs, ks = sl
            f = fb[:, qs, j] if per_row else fb[:, :, j]
            c = torch.exp(m[:, ks] - m[:, qs]) if m is not None else None
            gn = g_num[:, qs]
            g = gn * v[:, ks] if per_channel else (gn * v[:, ks]).sum(-1)  # (B, t, H)
            g += g_den[:, qs]  # gradient with respect to the weight a_{t, j} / its e factor
            fc = f if c is None else c * f
            de[:, ks].addcmul_(g, fc)
            a = e[:, ks] * fc  # (B, t, H) the weights
            dv[:, ks].addcmul_(gn, a if per_channel else a.unsqueeze(-1))
            gf = g.mul_(e[:, ks]) if c is None else g.mul_(e[:, ks]).mul_(c)  # g * e * c
            if fb.shape[0] == 1:
                gf = gf.sum(0, keepdim=True)
            if fb.shape[-1] == 1:
                gf = gf.sum(-1, keepdim=True)
            if per_row:
                dfb[:, qs, j] += gf
            else:
                dfb[:, :, j] += gf.sum(1, keepdim=True)
        return de, dv, dfb, None, None


# ----------------------------------------------------------------------------------------------------------------
# the shared 1-D engine: keys outside the band (bias 0) plus keys inside it (per-offset bias)
# ----------------------------------------------------------------------------------------------------------------


def _aft_1d(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    band_bias: torch.Tensor | None,
    offsets: tuple[int, ...],
    radius: int,
    causal: bool,
    key_mask: torch.Tensor | None,
) -> torch.Tensor:
    """Shared 1-D engine.

    Args:
        q, v: (B, T, C); k: (B, T, H) with C = H * D (H = C for per-channel keys).
        band_bias: (B or 1, T or 1, J, H or 1) bias of the key at offset offsets[j], or None for no band.
        offsets: the J key offsets t' - t inside the band (all within [-radius, radius], <= 0 when causal).
        radius: keys with |t' - t| <= radius are in the band, the others have bias 0. -1 means no band.
    """
    out_dtype = q.dtype
    dtype = _compute_dtype(q, k, v, *(() if band_bias is None else (band_bias,)))
    B, T, C = q.shape
    H = k.shape[-1]
    D = C // H
    qf, kf = q.to(dtype), k.to(dtype)
    vf = v.to(dtype).reshape(B, T, H, D)
    mask = key_mask.to(dtype) if key_mask is not None else None
    kf = _fill_masked_keys(kf, key_mask)

    # largest bias of each row's band (>= 0), so that M bounds every exponent
    if band_bias is not None:
        wmax = band_bias.to(dtype).detach().amax(dim=2).clamp_min(0)  # (B or 1, T or 1, H or 1)
    else:
        wmax = kf.new_zeros(1, 1)

    if causal:
        m = torch.cummax(kf.detach(), dim=1).values  # (B, T, H) running maximum of visible keys
    else:
        m = kf.detach().amax(dim=1, keepdim=True).expand(B, T, H)  # global maximum, visible to every row
    shift = m + wmax  # (B, T, H)  M_t

    # keys outside the band, bias 0: exact prefix (and suffix) sums of positive weights
    e = torch.exp(kf - m)  # <= 1
    if mask is not None:
        e = e * mask.unsqueeze(-1)
    x = torch.cat([e.unsqueeze(-1) * vf, e.unsqueeze(-1)], dim=-1)  # (B, T, H, D + 1) numerator | denominator
    lag = radius + 1  # first distance outside the band
    if causal:
        prefix = _decay_cumsum(x, m.unsqueeze(-1))  # relative to m_t
        # outside_t = prefix_{t - lag} * exp(m_{t - lag} - M_t)
        if lag < T:
            scaled = prefix[:, : T - lag] * torch.exp(m[:, : T - lag] - shift[:, lag:]).unsqueeze(-1)
            outside = torch.cat([scaled.new_zeros(B, lag, H, D + 1), scaled], dim=1)
        else:
            outside = torch.zeros_like(x)
    elif radius < 0:  # no band: every key has bias 0
        outside = x.sum(dim=1, keepdim=True).expand(B, T, H, D + 1)
    else:
        scale = torch.exp(m - shift).unsqueeze(-1)  # (B, T, H, 1) = exp(-wmax_t)
        prefix = _shift_forward(torch.cumsum(x, dim=1), lag)
        suffix = _shift_backward(torch.flip(torch.cumsum(torch.flip(x, [1]), dim=1), [1]), lag)
        outside = (prefix + suffix) * scale
    num, den = outside[..., :D], outside[..., D]

    if band_bias is not None and len(offsets) > 0:
        fb = torch.exp(band_bias.to(dtype) - wmax.unsqueeze(2))  # (B or 1, T or 1, J, H or 1) <= 1
        v_band = vf.squeeze(-1) if D == 1 else vf
        band_num, band_den = _BandSum.apply(e, v_band, fb, m if causal else None, tuple(offsets))
        num = num + band_num.reshape(B, T, H, D)
        den = den + band_den

    y = _safe_divide(num, den.unsqueeze(-1)).reshape(B, T, C)
    return (torch.sigmoid(qf) * y).to(out_dtype)


# ----------------------------------------------------------------------------------------------------------------
# the blocked engine for per-channel keys (aft_local, causal aft_simple): see aft_hub/ops/_band.py
# ----------------------------------------------------------------------------------------------------------------


def _blocked(qf, kf, vf, fmat, cvec, mask, key_mask, causal: bool, L: int, P: int, exact) -> torch.Tensor:
    """Run the blocked engine; in causal mode, rows flagged by :func:`_band.causal_shifts` (the running key maximum
    rises more than ``_band.CAP`` inside their block) are taken from ``exact()``, the loop path."""
    kd = kf.detach()
    if not causal:
        return _band.BlockAft.apply(
            qf, kf, vf, fmat, cvec, mask, kd.amax(dim=1, keepdim=True), None, None, False, L, P
        )
    rho, m_end, clamped, flags = _band.causal_shifts(kd, key_mask, L)
    y = _band.BlockAft.apply(qf, kf, vf, fmat, cvec, mask, rho, m_end, clamped, True, L, P)
    if flags is not None:
        y = torch.where(flags, exact().to(y.dtype), y)
    return y


def _local_factors(pos_bias: torch.Tensor, T: int, radius: int, causal: bool, L: int, P: int, dtype: torch.dtype):
    """Bias factors of the blocked engine for AFT-local: fmat (K, B or 1, nb, L, L) and cvec (B or 1, nb, L, 1).

    Row t = I L + i, piece j, key t' = (I - P + j) L + i'. In the band (|t' - t| <= radius) the factor is
    exp(w[t, t'] - wmax_t), for other visible keys exp(-wmax_t), 0 for keys outside the sequence (or in the future when
    causal). Only the O(T * (2P + 1) * L) entries near the diagonal of pos_bias are read.
    """
    dev = pos_bias.device
    K = P + 1 if causal else 2 * P + 1
    nb = -(-T // L)
    ar = torch.arange(L, device=dev)
    rows = (torch.arange(nb, device=dev)[:, None] * L + ar).view(1, nb, L, 1)  # t
    starts = (torch.arange(nb, device=dev)[None, :] + torch.arange(K, device=dev)[:, None] - P) * L  # (K, nb)
    cols = (starts[:, :, None] + ar).view(K, nb, 1, L)  # t'
    off = cols - rows  # (K, nb, L, L)
    visible = (rows < T) & (cols >= 0) & (cols < T)
    if causal:
        visible = visible & (off <= 0)
    band = visible & (off.abs() <= radius)
    wg = pos_bias[..., rows.clamp(max=T - 1), cols.clamp(0, T - 1)].to(dtype)  # (K, nb, L, L) or (B, K, nb, L, L)
    zero = torch.zeros((), dtype=dtype, device=dev)
    wg = torch.where(band, wg, zero)  # entries outside the band are never exponentiated
    wd = wg.detach().masked_fill(~band, float("-inf"))
    wmax = wd.amax(dim=-1).amax(dim=-3).clamp_min(0)  # (nb, L) or (B, nb, L)
    base = torch.exp(-wmax)  # weight of the keys with bias 0
    wm = wmax.unsqueeze(-3).unsqueeze(-1)  # (1, nb, L, 1) or (B, 1, nb, L, 1)
    fmat = torch.where(band, torch.exp(wg - wm), torch.where(visible, base.unsqueeze(-3).unsqueeze(-1), zero))
    if pos_bias.dim() == 2:
        return fmat.unsqueeze(1), base.unsqueeze(0).unsqueeze(-1)
    return fmat.transpose(0, 1), base.unsqueeze(-1)


def _prepare(q, k, v, key_mask, *extra):
    """Inputs in the compute dtype, keys with masked entries replaced, mask as a float (or None)."""
    dtype = _compute_dtype(q, k, v, *extra)
    qf, kf, vf = q.to(dtype), k.to(dtype), v.to(dtype)
    kf = _fill_masked_keys(kf, key_mask)
    mask = key_mask.to(dtype) if key_mask is not None else None
    return dtype, qf, kf, vf, mask


class _SimpleGlobal(torch.autograd.Function):
    """Non-causal AFT-simple, y = sigmoid(q) * N / D with N, D (B, 1, C) sums under the global key maximum.

    Processed in chunks of batch rows and channels; saves only the inputs and the (B, 1, C) sums, and recomputes
    exp(K - max) in the backward pass. k: masked keys already replaced; mask: (B, T) float or None.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask):
        B, T, C = q.shape
        tiny = torch.finfo(q.dtype).tiny
        mu = k.amax(dim=1, keepdim=True)  # (B, 1, C)
        yr = q.new_empty(B, 1, C)
        den = q.new_empty(B, 1, C)
        for b0, b1, c0, c1 in _band._chunks(B, T, C, q.device):
            bs, cs = slice(b0, b1), slice(c0, c1)
            e = torch.sub(k[bs, :, cs], mu[bs, :, cs]).exp_()  # <= 1
            if mask is not None:
                e.mul_(mask[bs].unsqueeze(-1))
            torch.sum(e, dim=1, keepdim=True, out=den[bs, :, cs])
            torch.sum(e.mul_(v[bs, :, cs]), dim=1, keepdim=True, out=yr[bs, :, cs])
        den.clamp_min_(tiny)  # no visible key: N = 0, so N / D = 0
        yr.div_(den)
        ctx.save_for_backward(q, k, v, mask, mu, yr, den)
        return torch.sigmoid(q).mul_(yr)

    @staticmethod
    def backward(ctx, gy):
        q, k, v, mask, mu, yr, den = ctx.saved_tensors
        B, T, C = q.shape
        gq, gk, gv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        gN = q.new_empty(B, 1, C)
        chunks = _band._chunks(B, T, C, q.device)
        for b0, b1, c0, c1 in chunks:
            bs, cs = slice(b0, b1), slice(c0, c1)
            s, g = torch.sigmoid(q[bs, :, cs]), gy[bs, :, cs]
            torch.ops.aten.sigmoid_backward(g * yr[bs, :, cs], s, grad_input=gq[bs, :, cs])
            torch.sum(s.mul_(g), dim=1, keepdim=True, out=gN[bs, :, cs])
        gN.div_(den).masked_fill_(den <= torch.finfo(den.dtype).tiny, 0)  # (B, 1, C)
        gD = -gN * yr
        for b0, b1, c0, c1 in chunks:
            bs, cs = slice(b0, b1), slice(c0, c1)
            e = torch.sub(k[bs, :, cs], mu[bs, :, cs]).exp_()
            if mask is not None:
                e.mul_(mask[bs].unsqueeze(-1))
            torch.mul(e, gN[bs, :, cs], out=gv[bs, :, cs])
            torch.addcmul(gD[bs, :, cs], v[bs, :, cs], gN[bs, :, cs], out=gk[bs, :, cs]).mul_(e)
        return gq, gk, gv, None


# ----------------------------------------------------------------------------------------------------------------
# public operators
# ----------------------------------------------------------------------------------------------------------------


def aft_simple(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, key_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """AFT-simple: w = 0, a per-channel softmax over time. O(T * C) time and memory.

    Non-causal: one weighted sum per channel under the global key maximum. Causal: the blocked engine of
    :mod:`aft_hub.ops._band` with lower-triangular (32 x 32) blocks of ones and a decayed carry between blocks; rows
    whose running key maximum rises by more than ``_band.CAP`` inside one block come from the exact log-depth scan.

    Args:
        q, k, v: (B, T, C).
        causal: position t sees keys t' <= t only (a running softmax-weighted average).
        key_mask: (B, T) bool, False for keys that take no part.

    Returns:
        (B, T, C) in the dtype of q.
    """
    B, T, C = _check_qkv(q, k, v)
    key_mask = _check_key_mask(key_mask, B, T)
    dtype, qf, kf, vf, mask = _prepare(q, k, v, key_mask)
    if not causal:
        return _SimpleGlobal.apply(qf, kf, vf, mask).to(q.dtype)
    L, P, nb = _band.block_layout(-1, T, True)
    tri = torch.ones(L, L, dtype=dtype, device=q.device).tril_().view(1, 1, 1, L, L)
    y = _blocked(
        qf, kf, vf, tri, None, mask, key_mask, True, L, P, lambda: _aft_1d(q, k, v, None, (), -1, True, key_mask)
    )
    return y.to(q.dtype)


def aft_local(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pos_bias: torch.Tensor,
    window: int,
    *,
    causal: bool = False,
    key_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """AFT-local: w[t, t'] = pos_bias[t, t'] where |t - t'| < window and 0 elsewhere (keys outside still count).

    O(T * window * C) time, O(T * C + T * window) memory: only the band of ``pos_bias`` is read.

    Method: the blocked engine of :mod:`aft_hub.ops._band`. Rows are cut into blocks of L rows (32 to 64); each row
    block meets its own and the ceil((window - 1) / L) neighbouring key blocks on each side through (L x L)
    bias-factor matrices in batched matrix products, and the keys further away (bias 0) through a per-block carry of
    positive sums. In causal mode, rows whose running key maximum rises by more than ``_band.CAP`` inside one block
    come from the exact loop over band offsets with a log-depth scan instead.

    Args:
        q, k, v: (B, T, C).
        pos_bias: (T, T), or (B, T, T) for one bias matrix per batch row (e.g. left-padded batches); larger trailing
            sizes are allowed (the top-left (T, T) block is used). pos_bias[..., t, t'].
        window: s >= 1; window 1 keeps only the diagonal bias.
        causal: position t sees keys t' <= t only.
        key_mask: (B, T) bool, False for keys that take no part.
    """
    B, T, C = _check_qkv(q, k, v)
    key_mask = _check_key_mask(key_mask, B, T)
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(f"window must be an int, got {type(window).__name__}.")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}.")
    _check_pos_bias(pos_bias, B, T)
    radius = min(window - 1, T - 1)
    L, P, nb = _band.block_layout(radius, T, causal)
    dtype, qf, kf, vf, mask = _prepare(q, k, v, key_mask, pos_bias)
    fmat, cvec = _local_factors(pos_bias, T, radius, causal, L, P, dtype)
    y = _blocked(
        qf,
        kf,
        vf,
        fmat,
        cvec,
        mask,
        key_mask,
        causal,
        L,
        P,
        lambda: _local_exact(q, k, v, pos_bias, radius, causal, key_mask),
    )
    return y.to(q.dtype)


def _local_exact(q, k, v, pos_bias, radius: int, causal: bool, key_mask) -> torch.Tensor:
    """AFT-local on the exact loop path: band[b, t, j] = pos_bias[b, t, t + offsets[j]] (O(T * window) gather)."""
    T = q.shape[1]
    offsets = torch.arange(-radius, 1 if causal else radius + 1, device=pos_bias.device)
    t_idx = torch.arange(T, device=pos_bias.device)
    cols = t_idx[:, None] + offsets[None, :]  # (T, J)
    valid = (cols >= 0) & (cols < T)
    pb = pos_bias[..., :T, :T] if pos_bias.dim() == 3 else pos_bias[:T, :T].unsqueeze(0)
    band = pb.gather(2, cols.clamp(0, T - 1).unsqueeze(0).expand(pb.shape[0], T, -1))  # (B or 1, T, J)
    band = torch.where(valid, band, torch.zeros((), dtype=band.dtype, device=band.device))
    return _aft_1d(q, k, v, band.unsqueeze(-1), tuple(offsets.tolist()), radius, causal, key_mask)


def _check_pos_bias(pos_bias, B: int, T: int) -> None:
    """pos_bias: (T', T') or (B, T', T') with T' >= T, floating point."""
    ndim = pos_bias.dim() if isinstance(pos_bias, torch.Tensor) else 2
    if ndim not in (2, 3):
        raise ValueError(f"pos_bias must be (T, T) or batched (B, T, T), got shape {tuple(pos_bias.shape)}.")
    _check_tensor("pos_bias", pos_bias, ndim)
    if ndim == 3 and pos_bias.shape[0] != B:
        raise ValueError(f"A batched pos_bias must have {B} rows (the batch size), got {pos_bias.shape[0]}.")
    if pos_bias.shape[-2] < T or pos_bias.shape[-1] < T:
        raise ValueError(
            f"pos_bias must be at least (T, T) = ({T}, {T}) in its last two dimensions, got {tuple(pos_bias.shape)}."
        )


def aft_conv1d(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weight: torch.Tensor,
    *,
    causal: bool = False,
    key_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """1-D AFT-conv (relative position bias, multi-head).

    Head i has one key channel and C // h query/value channels; the key at offset o = t' - t has bias
    weight[i, o + s // 2] when |o| <= s // 2 (the orientation of ``F.conv1d(..., padding=s // 2)``) and 0 outside.

    Args:
        q, v: (B, T, C); k: (B, T, h) with C divisible by h.
        weight: (h, s), s odd.
        causal: position t sees keys t' <= t only (only offsets <= 0 of the kernel count).
        key_mask: (B, T) bool, False for keys that take no part.
    """
    _check_tensor("k", k, 3)
    _check_tensor("weight", weight, 2)
    h, s = weight.shape
    B, T, C = _check_qkv(q, k, v, key_channels=k.shape[-1])
    if k.shape[-1] != h:
        raise ValueError(f"k has {k.shape[-1]} head channels but weight has {h} heads.")
    if C % h:
        raise ValueError(f"The channel count {C} must be divisible by the number of heads {h}.")
    if s % 2 == 0:
        raise ValueError(f"The kernel size must be odd, got {s}.")
    key_mask = _check_key_mask(key_mask, B, T)
    r = s // 2
    offsets = tuple(o for o in range(-r, 1 if causal else r + 1) if abs(o) < T)
    band = weight.t()[torch.tensor([o + r for o in offsets], device=weight.device)]  # (J, h)
    return _aft_1d(q, k, v, band.view(1, 1, len(offsets), h), offsets, r, causal, key_mask)


def aft_full(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pos_bias: torch.Tensor,
    *,
    causal: bool = False,
    key_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """AFT-full: w[t, t'] = pos_bias[t, t']. O(T^2 * C) time, O(T * C + T^2) memory, no (B, T, T, C) tensor.

    Non-causal: one matrix product exp(w - rowmax) @ [exp(K) * V | exp(K)] under a global per-channel key shift.
    Causal: the lower triangle is split into square blocks (binary decomposition); each block sees whole key
    blocks, whose own running maximum is an exact shift, so rows whose visible keys are far below later ones stay
    exact.

    Args:
        q, k, v: (B, T, C).
        pos_bias: (T, T), or (B, T, T) for one bias matrix per batch row (e.g. left-padded batches); larger trailing
            sizes are allowed (the top-left (T, T) block is used).
        causal: position t sees keys t' <= t only.
        key_mask: (B, T) bool, False for keys that take no part.
    """
    B, T, C = _check_qkv(q, k, v)
    key_mask = _check_key_mask(key_mask, B, T)
    _check_pos_bias(pos_bias, B, T)
    dtype, qf, kf, vf, mask = _prepare(q, k, v, key_mask, pos_bias)
    w = pos_bias[..., :T, :T].to(dtype)
    w = w.unsqueeze(0) if w.dim() == 2 else w  # (B or 1, T, T)
    mask = mask.unsqueeze(-1) if mask is not None else None
    if causal:
        num, den = _full_causal(kf, vf, w, mask)
    else:
        e = torch.exp(kf - kf.detach().amax(dim=1, keepdim=True))  # (B, T, C) <= 1
        if mask is not None:
            e = e * mask
        E = torch.exp(w - w.detach().amax(dim=-1, keepdim=True))  # (B or 1, T, T) <= 1
        x = torch.cat([e * vf, e], dim=-1)  # (B, T, 2C) numerator | denominator
        nd = torch.bmm(E, x) if E.shape[0] == B else torch.matmul(E[0], x)  # (B, T, 2C)
        num, den = nd[..., :C], nd[..., C:]
    return (torch.sigmoid(qf) * _safe_divide(num, den)).to(q.dtype)


def _full_causal(k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, mask: torch.Tensor | None):
    """Causal AFT-full numerator and denominator, both relative to M_t = cummax(K)_t + max_{t' <= t} w[t, t'].

    w: (B or 1, T, T).
    """
    B, T, C = k.shape
    Bw = w.shape[0]
    P = 1 << max(0, (T - 1).bit_length())  # padded length, a power of two
    pad = P - T
    m = torch.cummax(k.detach(), dim=1).values  # (B, T, C)
    tri = torch.ones(T, T, dtype=torch.bool, device=w.device).tril()
    n = torch.where(tri, w.detach(), torch.full_like(w, float("-inf"))).amax(dim=-1)  # (Bw, T) causal row max of w
    e_diag = torch.exp(k - m)
    if mask is not None:
        e_diag = e_diag * mask
    wd = torch.exp(torch.diagonal(w, dim1=-2, dim2=-1) - n).unsqueeze(-1)  # (Bw, T, 1)
    num = wd * e_diag * v  # the diagonal term t' = t
    den = wd * e_diag
    if P == 1:
        return num, den
    # pad to P: padded keys come after every real key and padded rows are dropped, so causality hides them
    kp = F.pad(k, (0, 0, 0, pad))
    vp = F.pad(v, (0, 0, 0, pad))
    mp = F.pad(m, (0, 0, 0, pad), mode="replicate")
    maskp = F.pad(mask if mask is not None else torch.ones_like(k[..., :1]), (0, 0, 0, pad))
    wp = F.pad(w, (0, pad, 0, pad))
    np_ = F.pad(n, (0, pad))
    num = F.pad(num, (0, 0, 0, pad))
    den = F.pad(den, (0, 0, 0, pad))
    b = 1
    while b < P:
        nb = P // (2 * b)
        # rows: odd blocks of size b; keys: the even block just before each (every key there is visible)
        k_keys = kp.view(B, nb, 2, b, C)[:, :, 0]  # (B, nb, b, C)
        v_keys = vp.view(B, nb, 2, b, C)[:, :, 0]
        m_blocks = mp.view(B, nb, 2, b, C)
        ref = m_blocks[:, :, 0, -1:]  # (B, nb, 1, C) running max at the end of the key block
        f = torch.exp(k_keys - ref) * maskp.view(B, nb, 2, b, 1)[:, :, 0]  # <= 1
        w_blocks = wp.view(Bw, nb, 2 * b, nb, 2 * b).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)  # (Bw, nb, 2b, 2b)
        w_blocks = w_blocks[:, :, b:, :b]  # (Bw, nb, b, b): rows of the odd block, keys of the even block
        E = torch.exp(w_blocks - np_.view(Bw, nb, 2, b)[:, :, 1, :, None])  # (Bw, nb, b, b) <= 1
        part = torch.matmul(E if Bw > 1 else E[0], torch.cat([f * v_keys, f], dim=-1))  # (B, nb, b, 2C)
        row_scale = torch.exp(ref - m_blocks[:, :, 1])  # (B, nb, b, C) <= 1
        zeros = part.new_zeros(B, nb, b, C)
        add_num = torch.stack([zeros, row_scale * part[..., :C]], dim=2).reshape(B, P, C)
        add_den = torch.stack([zeros, row_scale * part[..., C:]], dim=2).reshape(B, P, C)
        num = num + add_num
        den = den + add_den
        b *= 2
    return num[:, :T], den[:, :T]


# ----------------------------------------------------------------------------------------------------------------
# 2-D AFT-conv
# ----------------------------------------------------------------------------------------------------------------


def _excl_cumsum(x: torch.Tensor, dim: int, lag: int, reverse: bool) -> torch.Tensor:
    """Sum of x over indices <= i - lag (or >= i + lag when reverse) along dim, zero where empty."""
    n = x.shape[dim]
    if lag >= n:
        return torch.zeros_like(x)
    if reverse:
        c = torch.flip(torch.cumsum(torch.flip(x, [dim]), dim), [dim])
        body = c.narrow(dim, lag, n - lag)
        return torch.cat([body, torch.zeros_like(x.narrow(dim, 0, lag))], dim)
    c = torch.cumsum(x, dim)
    body = c.narrow(dim, 0, n - lag)
    return torch.cat([torch.zeros_like(x.narrow(dim, 0, lag)), body], dim)


def aft_conv2d(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """2-D AFT-conv on a token grid, the paper's AFT-conv (non-causal).

    Head i has one key channel and C // h query/value channels. The key at grid offset (di, dj) from the query has
    bias weight[i, di + s // 2, dj + s // 2] when |di|, |dj| <= s // 2 (the orientation of
    ``F.conv2d(..., padding=s // 2)``) and 0 outside: global connectivity is kept.

    The kernel term is a depthwise convolution with exp(w) (positive weights); the keys outside the kernel are summed
    exactly as rows above + rows below + (left and right parts of the kernel's rows), all sums of positive terms.
    O(H W s^2 C) time through ``F.conv2d``, O(H W C) memory.

    Args:
        q, v: (B, C, H, W); k: (B, h, H, W) with C divisible by h.
        weight: (h, s, s), s odd.

    Returns:
        (B, C, H, W) in the dtype of q.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, x, 4)
    _check_tensor("weight", weight, 3)
    B, C, H, W = q.shape
    h, s, s2 = weight.shape
    if v.shape != q.shape:
        raise ValueError(f"v must have the shape of q {tuple(q.shape)}, got {tuple(v.shape)}.")
    if tuple(k.shape) != (B, h, H, W):
        raise ValueError(f"k must have shape {(B, h, H, W)} (one channel per head), got {tuple(k.shape)}.")
    if s != s2 or s % 2 == 0:
        raise ValueError(f"weight must be (heads, s, s) with s odd, got {tuple(weight.shape)}.")
    if C % h:
        raise ValueError(f"The channel count {C} must be divisible by the number of heads {h}.")
    out_dtype = q.dtype
    dtype = _compute_dtype(q, k, v, weight)
    D = C // h
    r = s // 2
    qf, kf, vf, wf = q.to(dtype), k.to(dtype), v.to(dtype), weight.to(dtype)

    mu = kf.detach().amax(dim=(2, 3), keepdim=True)  # (B, h, 1, 1) global max per head
    wmax = wf.detach().amax(dim=(1, 2)).clamp_min(0)  # (h,)
    e = torch.exp(kf - mu)  # (B, h, H, W) <= 1
    x = torch.cat([(e.unsqueeze(2) * vf.view(B, h, D, H, W)), e.unsqueeze(2)], dim=2)  # (B, h, D + 1, H, W)
    x = x.reshape(B, h * (D + 1), H, W)

    # inside the kernel: depthwise conv with exp(w - wmax) <= 1, shared by the D + 1 channels of a head
    kernel = torch.exp(wf - wmax.view(h, 1, 1)).repeat_interleave(D + 1, dim=0).unsqueeze(1)  # (h(D+1), 1, s, s)
    inside = F.conv2d(x, kernel, padding=r, groups=h * (D + 1))

    # outside the kernel (bias 0), relative to mu; scaled by exp(-wmax) to share the shift mu + wmax
    row_tot = x.sum(dim=3, keepdim=True)  # (B, ., H, 1)
    above = _excl_cumsum(row_tot, 2, r + 1, reverse=False)
    below = _excl_cumsum(row_tot, 2, r + 1, reverse=True)
    left = _excl_cumsum(x, 3, r + 1, reverse=False)  # per row, columns <= j - r - 1
    right = _excl_cumsum(x, 3, r + 1, reverse=True)
    side = left + right
    # sum the side parts over the kernel's rows i - r .. i + r (a box sum of positive terms)
    side = F.avg_pool2d(side, (s, 1), stride=1, padding=(r, 0), count_include_pad=True) * s if r > 0 else side
    scale = torch.exp(-wmax).repeat_interleave(D + 1).view(1, h * (D + 1), 1, 1)
    total = (inside + (above + below + side) * scale).view(B, h, D + 1, H, W)
    num, den = total[:, :, :D], total[:, :, D:]
    y = _safe_divide(num, den).reshape(B, C, H, W)
    return (torch.sigmoid(qf) * y).to(out_dtype)
