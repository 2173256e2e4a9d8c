"""The AFT block: pre-norm residual mixer + MLP, with drop-path and optional layer-scale (torch only)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["Mlp", "DropPath", "LayerScale", "AftBlock"]


class Mlp(nn.Module):
    """Two-layer feed-forward network: Linear -> act -> dropout -> Linear -> dropout."""

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        act_layer: Callable[[], nn.Module] = nn.GELU,
        drop: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.fc1 = nn.Linear(dim, hidden_dim, **kw)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dim, dim, **kw)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth: drops the whole residual branch per sample with probability ``p`` in training."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop-path probability must be in [0, 1), got {p}.")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty([x.shape[0]] + [1] * (x.dim() - 1)).bernoulli_(keep)  # (B, 1, ...), scriptable
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LayerScale(nn.Module):
    """Per-channel learned scale of a residual branch (CaiT), initialised to ``init_values``."""

    def __init__(self, dim: int, init_values: float = 1e-5, device=None, dtype=None) -> None:
        super().__init__()
        self.init_values = init_values
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values), device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class AftBlock(nn.Module):
    """x + DropPath(LS(mixer(norm1(x)))), then x + DropPath(LS(mlp(norm2(x)))).

    The block never modifies its input in place, so it can run under activation (gradient) checkpointing.

    Args:
        dim: channels C.
        mixer: the token mixer, a module mapping (B, T, C) -> (B, T, C) that accepts ``hw``, ``key_mask`` and
            ``position_ids`` keywords (see :mod:`aft_hub.layers.mixers`).
        mlp_ratio: hidden size of the MLP over C.
        drop_path: stochastic-depth probability of both branches.
        init_values: layer-scale initial value, None for no layer-scale.
    """

    def __init__(
        self,
        dim: int,
        mixer: nn.Module,
        mlp_ratio: float = 4.0,
        drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        act_layer: Callable[[], nn.Module] = nn.GELU,
        norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
        mlp_hidden_dim: int | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.norm1 = norm_layer(dim, **kw)
        self.mixer = mixer
        self.ls1 = LayerScale(dim, init_values, **kw) if init_values is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim, **kw)
        hidden = mlp_hidden_dim if mlp_hidden_dim is not None else int(dim * mlp_ratio)
        self.mlp = Mlp(dim, hidden, act_layer=act_layer, drop=drop, **kw)
        self.ls2 = LayerScale(dim, init_values, **kw) if init_values is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        hw: tuple[int, int] | None = None,
        key_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        mixed = self.mixer(self.norm1(x), hw=hw, key_mask=key_mask, position_ids=position_ids)
        x = x + self.drop_path1(self.ls1(mixed))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x
