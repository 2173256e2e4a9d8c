"""Plain reference implementations of the AFT operators.

Each function evaluates the paper's formula directly, one query position at a time, in float64:

    Y_t = sigmoid(Q_t) * sum_t' exp(K_t' + w[t, t']) V_t' / sum_t' exp(K_t' + w[t, t'])

They are slow (a Python loop over positions) and exist to be read and to hold the fast paths in
:mod:`aft_hub.ops.functional` to account in the tests. Rows that see no key at all (every key masked)
are defined as 0, like the fast paths.
"""

from __future__ import annotations

import torch

__all__ = [
    "aft_full_reference",
    "aft_simple_reference",
    "aft_local_reference",
    "aft_conv1d_reference",
    "aft_conv2d_reference",
]


def _row(
    q_t: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """One output row.

    Args:
        q_t: (B, C) query at position t.
        k: (B, T, C) keys, already broadcast to C channels.
        v: (B, T, C) values.
        bias: (T, C) or (T, 1) bias w[t, t'] for this row.
        visible: (B, T) bool, which keys this row may use.
    """
    logits = k + bias.unsqueeze(0)  # (B, T, C)
    logits = logits.masked_fill(~visible.unsqueeze(-1), float("-inf"))
    any_visible = visible.any(dim=1, keepdim=True)  # (B, 1)
    weights = torch.softmax(logits, dim=1)  # softmax over t', per channel
    weights = torch.where(any_visible.unsqueeze(-1), weights, torch.zeros_like(weights))
    return torch.sigmoid(q_t) * (weights * v).sum(dim=1)


def _general(q, k, v, bias_fn, causal: bool, key_mask) -> torch.Tensor:
    out_dtype = q.dtype
    q, k, v = (x.double() for x in (q, k, v))
    B, T, C = q.shape
    if k.shape[-1] != C:  # per-head keys: broadcast each head to its C // h channels
        k = k.repeat_interleave(C // k.shape[-1], dim=-1)
    mask = torch.ones(B, T, dtype=torch.bool, device=q.device) if key_mask is None else key_mask.bool()
    positions = torch.arange(T, device=q.device)
    rows = []
    for t in range(T):
        visible = mask & (positions <= t) if causal else mask
        rows.append(_row(q[:, t], k, v, bias_fn(t).double(), visible))
    return torch.stack(rows, dim=1).to(out_dtype)


def aft_full_reference(q, k, v, pos_bias, *, causal: bool = False, key_mask=None) -> torch.Tensor:
    """AFT-full: w[t, t'] = pos_bias[t, t']."""
    return _general(q, k, v, lambda t: pos_bias[t].unsqueeze(-1), causal, key_mask)


def aft_simple_reference(q, k, v, *, causal: bool = False, key_mask=None) -> torch.Tensor:
    """AFT-simple: w = 0."""
    T = q.shape[1]
    zeros = torch.zeros(T, 1, dtype=torch.float64, device=q.device)
    return _general(q, k, v, lambda t: zeros, causal, key_mask)


def aft_local_reference(q, k, v, pos_bias, window: int, *, causal: bool = False, key_mask=None) -> torch.Tensor:
    """AFT-local: w[t, t'] = pos_bias[t, t'] where |t - t'| < window, else 0."""
    T = q.shape[1]
    positions = torch.arange(T, device=q.device)

    def bias(t: int) -> torch.Tensor:
        inside = (positions - t).abs() < window
        return torch.where(inside, pos_bias[t].double(), torch.zeros((), dtype=torch.float64)).unsqueeze(-1)

    return _general(q, k, v, bias, causal, key_mask)


def aft_conv1d_reference(q, k, v, weight, *, causal: bool = False, key_mask=None) -> torch.Tensor:
    """1-D AFT-conv: head i's key at offset o = t' - t has bias weight[i, o + s // 2] when |o| <= s // 2, else 0."""
    B, T, C = q.shape
    h, s = weight.shape
    r = s // 2
    positions = torch.arange(T, device=q.device)

    def bias(t: int) -> torch.Tensor:
        offset = positions - t  # (T,)
        inside = offset.abs() <= r
        idx = (offset + r).clamp(0, s - 1)
        per_head = torch.where(inside.unsqueeze(-1), weight.double().t()[idx], torch.zeros((), dtype=torch.float64))
        return per_head.repeat_interleave(C // h, dim=-1)  # (T, C)

    return _general(q, k, v, bias, causal, key_mask)


def aft_conv2d_reference(q, k, v, weight) -> torch.Tensor:
    """2-D AFT-conv on a (H, W) grid, q and v (B, C, H, W), k (B, h, H, W), weight (h, s, s).

    The key at grid offset (di, dj) from the query has bias weight[i, di + s // 2, dj + s // 2] inside the kernel
    and 0 outside.
    """
    B, C, H, W = q.shape
    h, s, _ = weight.shape
    r = s // 2
    flat = lambda x: x.flatten(2).transpose(1, 2)  # (B, C, H, W) -> (B, H*W, C)  # noqa: E731
    rows = torch.arange(H, device=q.device).repeat_interleave(W)
    cols = torch.arange(W, device=q.device).repeat(H)

    def bias(t: int) -> torch.Tensor:
        di, dj = rows - rows[t], cols - cols[t]
        inside = (di.abs() <= r) & (dj.abs() <= r)
        w = weight.double()[:, (di + r).clamp(0, s - 1), (dj + r).clamp(0, s - 1)].t()  # (H*W, h)
        w = torch.where(inside.unsqueeze(-1), w, torch.zeros((), dtype=torch.float64))
        return w.repeat_interleave(C // h, dim=-1)

    y = _general(flat(q), flat(k), flat(v), bias, False, None)
    return y.transpose(1, 2).reshape(B, C, H, W)
