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

Causal decoding (the causal :class:`AftSimple`, :class:`AftLocal`, :class:`AftFull` and :class:`AftConv1d`):
``prefill(x, key_mask=..., position_ids=...)`` runs a prompt in parallel and also returns the decoding state of
:mod:`aft_hub.ops.decode`; ``step(x_t, state, key_mask_t=..., position_ids=...)`` then mixes one token (B, C) at a
time and returns the new state. Its size is independent of the context length except for AFT-full.
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops import aft_conv1d, aft_conv2d, aft_full, aft_local, aft_simple
from ..ops.decode import (
    AFTDecodeState,
    AFTFullDecodeState,
    aft_conv1d_prefill_state,
    aft_conv1d_step,
    aft_full_prefill_state,
    aft_full_step,
    aft_local_prefill_state,
    aft_local_step,
    aft_simple_prefill_state,
    aft_simple_step,
)

__all__ = ["PositionBias", "ConvKernel", "AftFull", "AftSimple", "AftLocal", "AftConv", "AftConv1d", "AFT_MIXERS"]


# TorchScript: the mixers' forward methods are scriptable and call the operators (plain Python, not scriptable)
# through these wrappers, which TorchScript leaves to Python (a scripted model runs, but cannot be saved).
@torch.jit.ignore
def _simple_op(q, k, v, causal, key_mask):
    # type: (Tensor, Tensor, Tensor, bool, Optional[Tensor]) -> Tensor
    return aft_simple(q, k, v, causal=causal, key_mask=key_mask)


@torch.jit.ignore
def _full_op(q, k, v, w, causal, key_mask):
    # type: (Tensor, Tensor, Tensor, Tensor, bool, Optional[Tensor]) -> Tensor
    return aft_full(q, k, v, w, causal=causal, key_mask=key_mask)


@torch.jit.ignore
def _local_op(q, k, v, w, window, causal, key_mask):
    # type: (Tensor, Tensor, Tensor, Tensor, int, bool, Optional[Tensor]) -> Tensor
    return aft_local(q, k, v, w, window, causal=causal, key_mask=key_mask)


@torch.jit.ignore
def _conv1d_op(q, k, v, weight, causal, key_mask):
    # type: (Tensor, Tensor, Tensor, Tensor, bool, Optional[Tensor]) -> Tensor
    return aft_conv1d(q, k, v, weight, causal=causal, key_mask=key_mask)


@torch.jit.ignore
def _conv2d_op(q, k, v, weight):
    # type: (Tensor, Tensor, Tensor, Tensor) -> Tensor
    return aft_conv2d(q, k, v, weight)


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

    def gather(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """Bias of a few keys for one query per row, as decoding needs it: out[b, j] = w[q[b], k[b, j]].

        Args:
            query_positions: (B,) long, the query position of each row.
            key_positions: (B, J) long, the key positions; negative entries (before the sequence start) give 0.

        Returns:
            (B, J).
        """
        if query_positions.numel():
            top = torch.maximum(query_positions.max(), key_positions.max()) if key_positions.numel() else None
            self._check_len(int(top if top is not None else query_positions.max()) + 1)  # one host sync
        qp = query_positions.clamp_min(0)
        kp = key_positions.clamp_min(0)
        if self.rank is None:
            w = self.weight[qp.unsqueeze(-1), kp]
        else:
            w = torch.einsum("bd,bjd->bj", self.u[qp], self.v[kp])
        return torch.where(key_positions >= 0, w, torch.zeros((), dtype=w.dtype, device=w.device))

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
        dims = list(range(1, self.weight.dim()))
        raw = self.weight
        mean = raw.mean(dim=dims, keepdim=True)
        std = raw.var(dim=dims, keepdim=True, unbiased=False).add(self.eps).sqrt()
        shape = [-1] + [1] * self.ndim
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

    def _require_causal(self) -> None:
        if not getattr(self, "causal", False):
            raise ValueError(f"{type(self).__name__} decodes token by token only when built with causal=True.")

    def prefill(
        self, x: torch.Tensor, key_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, AFTDecodeState | AFTFullDecodeState]:
        """Causal forward over a prompt (B, T, C) that also returns the decoding state after it.

        Args:
            x: (B, T, C) the prompt's tokens.
            key_mask: (B, T) bool, False for keys that take no part (padding).
            position_ids: (B, T) long positions for an absolute position bias (default arange(T)).

        Returns:
            The mixer output (B, T, C), as ``forward`` gives it, and the state to continue with :meth:`step`.
        """
        raise NotImplementedError(f"{type(self).__name__} has no causal decoding.")

    def step(
        self,
        x_t: torch.Tensor,
        state: AFTDecodeState | AFTFullDecodeState | None,
        key_mask_t: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, AFTDecodeState | AFTFullDecodeState]:
        """Mix one token (B, C) given the state after the previous ones; returns (B, C) and the new state.

        Args:
            x_t: (B, C) the current token.
            state: from :meth:`prefill` or the previous :meth:`step` (None at the sequence start).
            key_mask_t: (B,) bool, False where the current key takes no part.
            position_ids: positions for an absolute position bias, the current token's last: (B, window) for the
                window keys of :class:`AftLocal` (oldest first), (B, t + 1) for every key of :class:`AftFull`.
                Default: the index positions state.step - window + 1 .. state.step (resp. 0 .. state.step).
        """
        raise NotImplementedError(f"{type(self).__name__} has no causal decoding.")


class AftSimple(_AftMixer):
    """AFT-simple mixer (no position bias). O(T * C)."""

    def __init__(self, dim: int, causal: bool = False, qkv_bias: bool = True, proj_drop: float = 0.0, **kw):
        super().__init__(dim, dim, qkv_bias, proj_drop, **kw)
        self.causal = causal

    def forward(
        self,
        x: torch.Tensor,
        hw: tuple[int, int] | None = None,
        key_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        q, k, v = self.project(x)
        return self.output(_simple_op(q, k, v, self.causal, key_mask))

    def prefill(self, x, key_mask=None, position_ids=None):
        self._require_causal()
        q, k, v = self.project(x)
        y = aft_simple(q, k, v, causal=True, key_mask=key_mask)
        return self.output(y), aft_simple_prefill_state(k, v, key_mask=key_mask)

    def step(self, x_t, state, key_mask_t=None, position_ids=None):
        self._require_causal()
        q, k, v = self.project(x_t)
        y, state = aft_simple_step(q, k, v, state, key_mask_t=key_mask_t)
        return self.output(y), state


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

    def forward(
        self,
        x: torch.Tensor,
        hw: tuple[int, int] | None = None,
        key_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        q, k, v = self.project(x)
        w = self.pos_bias(x.shape[1], position_ids)
        return self.output(_full_op(q, k, v, w, self.causal, key_mask))

    def prefill(self, x, key_mask=None, position_ids=None):
        self._require_causal()
        q, k, v = self.project(x)
        w = self.pos_bias(x.shape[1], position_ids)
        y = aft_full(q, k, v, w, causal=True, key_mask=key_mask)
        return self.output(y), aft_full_prefill_state(k, v, key_mask=key_mask)

    def step(self, x_t, state, key_mask_t=None, position_ids=None):
        self._require_causal()
        t = 0 if state is None else state.step
        if position_ids is None:
            position_ids = torch.arange(t + 1, device=x_t.device).expand(x_t.shape[0], t + 1)
        if tuple(position_ids.shape) != (x_t.shape[0], t + 1):
            raise ValueError(
                f"position_ids must hold the positions of all {t + 1} keys, (batch, t + 1) = {(x_t.shape[0], t + 1)}, "
                f"got {tuple(position_ids.shape)}."
            )
        bias_t = self.pos_bias.gather(position_ids[:, -1], position_ids)  # (B, t + 1)
        q, k, v = self.project(x_t)
        y, state = aft_full_step(q, k, v, bias_t, state, key_mask_t=key_mask_t)
        return self.output(y), state


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

    def forward(
        self,
        x: torch.Tensor,
        hw: tuple[int, int] | None = None,
        key_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
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
            return self.output(_full_op(q, k, v, w, self.causal, key_mask))
        return self.output(_local_op(q, k, v, w, self.window, self.causal, key_mask))

    def _require_sequence_window(self) -> None:
        self._require_causal()
        if self.grid_window:
            raise ValueError("AftLocal with a 2-D grid window has no causal decoding.")

    def prefill(self, x, key_mask=None, position_ids=None):
        self._require_sequence_window()
        q, k, v = self.project(x)
        w = self.pos_bias(x.shape[1], position_ids)
        y = aft_local(q, k, v, w, self.window, causal=True, key_mask=key_mask)
        return self.output(y), aft_local_prefill_state(k, v, self.window, key_mask=key_mask)

    def step(self, x_t, state, key_mask_t=None, position_ids=None):
        self._require_sequence_window()
        B, s = x_t.shape[0], self.window
        if position_ids is None:
            t = 0 if state is None else state.step
            position_ids = torch.arange(t - s + 1, t + 1, device=x_t.device).expand(B, s)
        if tuple(position_ids.shape) != (B, s):
            raise ValueError(
                f"position_ids must hold the positions of the {s} window keys, (batch, window) = {(B, s)}, "
                f"got {tuple(position_ids.shape)}."
            )
        # bias_t[:, o] = w[t, t - o]: the key o positions back, the current one first
        bias_t = self.pos_bias.gather(position_ids[:, -1], position_ids.flip(-1))  # (B, window)
        q, k, v = self.project(x_t)
        y, state = aft_local_step(q, k, v, bias_t, s, state, key_mask_t=key_mask_t)
        return self.output(y), state


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

    def forward(
        self,
        x: torch.Tensor,
        hw: tuple[int, int] | None = None,
        key_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if hw is None:
            raise ValueError("AftConv needs the token grid hw=(H, W).")
        if key_mask is not None:
            raise ValueError("AftConv (2-D) does not support key_mask.")
        B, T, C = x.shape
        H, W = hw
        if H * W != T:
            raise ValueError(f"Grid {H}x{W} does not match the {T} tokens.")
        q, k, v = self.project(x)
        q = q.transpose(1, 2).reshape(B, C, H, W)  # (B, T, C) -> (B, C, H, W)
        k = k.transpose(1, 2).reshape(B, self.heads, H, W)  # (B, T, h) -> (B, h, H, W)
        v = v.transpose(1, 2).reshape(B, C, H, W)
        y = _conv2d_op(q, k, v, self.kernel())
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

    def forward(
        self,
        x: torch.Tensor,
        hw: tuple[int, int] | None = None,
        key_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        q, k, v = self.project(x)
        return self.output(_conv1d_op(q, k, v, self.kernel(), self.causal, key_mask))

    def prefill(self, x, key_mask=None, position_ids=None):
        self._require_causal()
        q, k, v = self.project(x)
        weight = self.kernel()
        y = aft_conv1d(q, k, v, weight, causal=True, key_mask=key_mask)
        return self.output(y), aft_conv1d_prefill_state(k, v, weight, key_mask=key_mask)

    def step(self, x_t, state, key_mask_t=None, position_ids=None):
        self._require_causal()
        q, k, v = self.project(x_t)
        y, state = aft_conv1d_step(q, k, v, self.kernel(), state, key_mask_t=key_mask_t)
        return self.output(y), state


AFT_MIXERS = {"full": AftFull, "simple": AftSimple, "local": AftLocal, "conv": AftConv, "conv1d": AftConv1d}

