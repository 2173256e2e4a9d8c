"""AFT token mixers: projections around the operators of :mod:`aft_hub.ops`.

Every mixer maps tokens (B, T, C) to (B, T, C) and accepts the same keyword arguments, so blocks and front ends can
treat them alike:

* ``hw``: the (H, W) token grid, needed by :class:`AftConv` (2-D); ignored by the others.
* ``key_mask``: (B, T) bool, False for padding keys.
* ``position_ids``: (B, T) long positions for the absolute position bias of :class:`AftFull` / :class:`AftLocal`
  (per-row positions keep left-padded batches equal to their rows alone); default ``arange(T)``.

Position biases of AFT-full/local are factorised, w = u v^T with u, v in R^{T_max x d'} initialised N(0, 0.01^2)
(the paper's d' = 128 for ImageNet, 256 for Enwik8), or dense (T_max x T_max, zero-initialised) when ``bias_rank``
is None. AFT-conv keeps per-head kernels reparameterised as gamma * standardise(w) + beta with gamma = beta = 0 at
init, so a freshly built AFT-conv layer computes AFT-simple.
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops import aft_conv1d, aft_conv2d, aft_full, aft_local, aft_simple

__all__ = ["PositionBias", "ConvKernel", "AftFull", "AftSimple", "AftLocal", "AftConv", "AftConv1d", "AFT_MIXERS"]


class PositionBias(nn.Module):
    """Learned pairwise position bias w[t, t'] for up to ``max_len`` positions.

    Args:
        max_len: largest sequence length T_max.
        rank: d' of the factorisation w = u v^T; None for a dense (T_max, T_max) bias.
        init_std: standard deviation of the N(0, std^2) initialisation of u and v.
    """

    def __init__(
        self, max_len: int, rank: int | None = 128, init_std: float = 1e-2, device=None, dtype=None
    ) -> None:
        super().__init__()
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}.")
        if rank is not None and rank < 1:
            raise ValueError(f"bias rank must be >= 1 or None (dense), got {rank}.")
        self.max_len = max_len
        self.rank = rank
        self.init_std = init_std
        kw = dict(device=device, dtype=dtype)
        if rank is None:
            self.weight = nn.Parameter(torch.zeros(max_len, max_len, **kw))
        else:
            self.u = nn.Parameter(torch.empty(max_len, rank, **kw))
            self.v = nn.Parameter(torch.empty(max_len, rank, **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.rank is None:
            nn.init.zeros_(self.weight)
        else:
            nn.init.normal_(self.u, std=self.init_std)
            nn.init.normal_(self.v, std=self.init_std)

    def _check_len(self, T: int) -> None:
        if T > self.max_len:
            raise ValueError(
                f"Sequence length {T} exceeds the {self.max_len} positions this absolute position bias was built "
                f"for (max_position_embeddings / img_size); use a shorter input or a relative-bias (conv) variant."
            )

    def forward(self, T: int, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The bias for T positions: (T, T), or (B, T, T) for per-row ``position_ids`` (B, T)."""
        self._check_len(T)
        if position_ids is None:
            if self.rank is None:
                return self.weight[:T, :T]
            return self.u[:T] @ self.v[:T].t()
        if position_ids.max() >= self.max_len:
            self._check_len(int(position_ids.max()) + 1)
        pos = position_ids.clamp_min(0)
        if self.rank is None:
            return self.weight[pos.unsqueeze(-1), pos.unsqueeze(-2)]
        return self.u[pos] @ self.v[pos].transpose(-1, -2)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, rank={self.rank}"


class ConvKernel(nn.Module):
    """Per-head relative-position kernels w_i = gamma_i * standardise(raw_i) + beta_i (gamma = beta = 0 at init).

    Args:
        heads: number of heads h.
        kernel_size: s (odd).
        ndim: 1 for sequences (h, s) or 2 for token grids (h, s, s).
    """

    def __init__(self, heads: int, kernel_size: int, ndim: int = 2, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be a positive odd number, got {kernel_size}.")
        if ndim not in (1, 2):
            raise ValueError(f"ndim must be 1 or 2, got {ndim}.")
        kw = dict(device=device, dtype=dtype)
        self.heads, self.kernel_size, self.ndim, self.eps = heads, kernel_size, ndim, eps
        self.weight = nn.Parameter(torch.empty((heads,) + (kernel_size,) * ndim, **kw))
        self.gamma = nn.Parameter(torch.zeros(heads, **kw))
        self.beta = nn.Parameter(torch.zeros(heads, **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=1.0)
        nn.init.zeros_(self.gamma)
        nn.init.zeros_(self.beta)

    def forward(self) -> torch.Tensor:
        """The effective bias kernel, (h, s) or (h, s, s)."""
        dims = tuple(range(1, self.weight.dim()))
        raw = self.weight
        mean = raw.mean(dim=dims, keepdim=True)
        std = raw.var(dim=dims, keepdim=True, unbiased=False).add(self.eps).sqrt()
        shape = (-1,) + (1,) * self.ndim
        return self.gamma.view(shape) * (raw - mean) / std + self.beta.view(shape)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, kernel_size={self.kernel_size}, ndim={self.ndim}"


class _AftMixer(nn.Module):
    """Q, K, V and output projections shared by the mixers; K has ``key_dim`` channels."""

    def __init__(
        self, dim: int, key_dim: int, qkv_bias: bool = True, proj_drop: float = 0.0, device=None, dtype=None
    ) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.dim = dim
        self.key_dim = key_dim
        self.q = nn.Linear(dim, dim, bias=qkv_bias, **kw)
        self.k = nn.Linear(dim, key_dim, bias=qkv_bias, **kw)
        self.v = nn.Linear(dim, dim, bias=qkv_bias, **kw)
        self.proj = nn.Linear(dim, dim, **kw)
        self.proj_drop = nn.Dropout(proj_drop)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, C) -> q (B, T, C), k (B, T, key_dim), v (B, T, C)."""
        return self.q(x), self.k(x), self.v(x)

    def output(self, y: torch.Tensor) -> torch.Tensor:
        return self.proj_drop(self.proj(y))


class AftSimple(_AftMixer):
    """AFT-simple mixer (no position bias). O(T * C)."""

    def __init__(self, dim: int, causal: bool = False, qkv_bias: bool = True, proj_drop: float = 0.0, **kw):
        super().__init__(dim, dim, qkv_bias, proj_drop, **kw)
        self.causal = causal

    def forward(self, x, hw=None, key_mask=None, position_ids=None) -> torch.Tensor:
        q, k, v = self.project(x)
        return self.output(aft_simple(q, k, v, causal=self.causal, key_mask=key_mask))


class AftFull(_AftMixer):
    """AFT-full mixer with a learned pairwise position bias (factorised by default). O(T^2 * C)."""

    def __init__(
        self,
        dim: int,
        max_len: int,
        bias_rank: int | None = 128,
        causal: bool = False,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        **kw,
    ):
        super().__init__(dim, dim, qkv_bias, proj_drop, **kw)
        self.causal = causal
        self.pos_bias = PositionBias(max_len, bias_rank, **kw)

    def forward(self, x, hw=None, key_mask=None, position_ids=None) -> torch.Tensor:
        q, k, v = self.project(x)
        w = self.pos_bias(x.shape[1], position_ids)
        return self.output(aft_full(q, k, v, w, causal=self.causal, key_mask=key_mask))


class AftLocal(_AftMixer):
    """AFT-local mixer: the learned bias applies where |t - t'| < window, 0 (not -inf) elsewhere.

    With ``hw`` given and ``grid_window`` True (vision), the window is the 2-D neighbourhood
    max(|di|, |dj|) < window on the token grid, evaluated as AFT-full with the bias zeroed outside it.
    """

    def __init__(
        self,
        dim: int,
        max_len: int,
        window: int = 32,
        bias_rank: int | None = 128,
        causal: bool = False,
        grid_window: bool = False,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        **kw,
    ):
        super().__init__(dim, dim, qkv_bias, proj_drop, **kw)
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}.")
        self.window = window
        self.causal = causal
        self.grid_window = grid_window
        self.pos_bias = PositionBias(max_len, bias_rank, **kw)

    def forward(self, x, hw=None, key_mask=None, position_ids=None) -> torch.Tensor:
        q, k, v = self.project(x)
        T = x.shape[1]
        w = self.pos_bias(T, position_ids)
        if self.grid_window and hw is not None:
            H, W = hw
            if H * W != T:
                raise ValueError(f"Grid {H}x{W} does not match the {T} tokens.")
            idx = torch.arange(T, device=x.device)
            di = (idx // W)[:, None] - (idx // W)[None, :]
            dj = (idx % W)[:, None] - (idx % W)[None, :]
            inside = (di.abs() < self.window) & (dj.abs() < self.window)
            w = torch.where(inside, w, torch.zeros((), dtype=w.dtype, device=w.device))
            return self.output(aft_full(q, k, v, w, causal=self.causal, key_mask=key_mask))
        return self.output(aft_local(q, k, v, w, self.window, causal=self.causal, key_mask=key_mask))


class AftConv(_AftMixer):
    """2-D AFT-conv mixer on a token grid: h heads, K with h channels, per-head s x s relative-bias kernels."""

    def __init__(
        self,
        dim: int,
        heads: int = 32,
        kernel_size: int = 11,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        **kw,
    ):
        if dim % heads:
            raise ValueError(f"dim {dim} must be divisible by heads {heads}.")
        super().__init__(dim, heads, qkv_bias, proj_drop, **kw)
        self.heads = heads
        self.kernel = ConvKernel(heads, kernel_size, ndim=2, **kw)

    def forward(self, x, hw=None, key_mask=None, position_ids=None) -> torch.Tensor:
        if hw is None:
            raise ValueError("AftConv needs the token grid hw=(H, W).")
        if key_mask is not None:
            raise ValueError("AftConv (2-D) does not support key_mask.")
        B, T, C = x.shape
        H, W = hw
        if H * W != T:
            raise ValueError(f"Grid {H}x{W} does not match the {T} tokens.")
        q, k, v = self.project(x)
        to_grid = lambda t: t.transpose(1, 2).reshape(B, t.shape[-1], H, W)  # noqa: E731  (B, T, c) -> (B, c, H, W)
        y = aft_conv2d(to_grid(q), to_grid(k), to_grid(v), self.kernel())
        return self.output(y.reshape(B, C, T).transpose(1, 2))


class AftConv1d(_AftMixer):
    """1-D AFT-conv mixer for sequences (relative bias; the LM's "conv" variant, causal by default)."""

    def __init__(
        self,
        dim: int,
        heads: int = 8,
        kernel_size: int = 63,
        causal: bool = True,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        **kw,
    ):
        if dim % heads:
            raise ValueError(f"dim {dim} must be divisible by heads {heads}.")
        super().__init__(dim, heads, qkv_bias, proj_drop, **kw)
        self.heads = heads
        self.causal = causal
        self.kernel = ConvKernel(heads, kernel_size, ndim=1, **kw)

    def forward(self, x, hw=None, key_mask=None, position_ids=None) -> torch.Tensor:
        q, k, v = self.project(x)
        return self.output(aft_conv1d(q, k, v, self.kernel(), causal=self.causal, key_mask=key_mask))


AFT_MIXERS = {"full": AftFull, "simple": AftSimple, "local": AftLocal, "conv": AftConv, "conv1d": AftConv1d}

