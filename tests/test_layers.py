"""Tests of the shared modules (aft_hub.layers) against independent formulas and the float64 references."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from aft_hub.layers import AftBlock, AftConv, AftConv1d, AftFull, AftLocal, AftSimple, ConvKernel, PositionBias
from aft_hub.ops import (
    aft_conv1d_reference,
    aft_full_reference,
    aft_local_reference,
    aft_simple_reference,
)


def _qkv(mixer, x):
    return mixer.q(x), mixer.k(x), mixer.v(x)


def _n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("dim,heads,s", [(16, 4, 3), (12, 1, 5), (8, 8, 3)])
def test_aftconv_at_init_equals_aftsimple(dim, heads, s):
    torch.manual_seed(0)
    conv = AftConv(dim, heads=heads, kernel_size=s)
    simple = AftSimple(dim)
    with torch.no_grad():
        simple.q.load_state_dict(conv.q.state_dict())
        simple.v.load_state_dict(conv.v.state_dict())
        simple.proj.load_state_dict(conv.proj.state_dict())
        # AFT-simple with the head's single key broadcast to the head's channels
        simple.k.weight.copy_(conv.k.weight.repeat_interleave(dim // heads, dim=0))
        simple.k.bias.copy_(conv.k.bias.repeat_interleave(dim // heads, dim=0))
    x = torch.randn(2, 5 * 3, dim)
    torch.testing.assert_close(conv(x, hw=(5, 3)), simple(x), rtol=1e-5, atol=1e-6)
    # and once the kernel is trained away from zero, it no longer is AFT-simple
    with torch.no_grad():
        conv.kernel.gamma.fill_(2.0)
    assert not torch.allclose(conv(x, hw=(5, 3)), simple(x), atol=1e-4)


def test_mixer_param_counts_match_formula():
    d, T, r, h, s = 24, 10, 4, 6, 5
    proj = 3 * (d * d + d)  # q, v, output projections with biases
    assert _n_params(AftSimple(d)) == proj + d * d + d
    assert _n_params(AftFull(d, T, bias_rank=r)) == proj + d * d + d + 2 * T * r
    assert _n_params(AftFull(d, T, bias_rank=None)) == proj + d * d + d + T * T
    assert _n_params(AftLocal(d, T, window=3, bias_rank=r)) == proj + d * d + d + 2 * T * r
    assert _n_params(AftConv(d, heads=h, kernel_size=s)) == proj + d * h + h + h * s * s + 2 * h
    assert _n_params(AftConv1d(d, heads=h, kernel_size=s)) == proj + d * h + h + h * s + 2 * h
    block = AftBlock(d, AftSimple(d), mlp_ratio=4.0, init_values=1e-5)
    mlp = d * 4 * d + 4 * d + 4 * d * d + d
    assert _n_params(block) == _n_params(AftSimple(d)) + mlp + 2 * 2 * d + 2 * d


@pytest.mark.parametrize("causal", [False, True])
def test_mixers_match_reference(causal):
    torch.manual_seed(1)
    d, T = 8, 9
    x = torch.randn(2, T, d)
    mask = torch.ones(2, T, dtype=torch.bool)
    mask[1, :3] = False

    m = AftFull(d, T, bias_rank=3, causal=causal)
    w = m.pos_bias.u @ m.pos_bias.v.t()
    ref = m.proj(aft_full_reference(*_qkv(m, x), w, causal=causal, key_mask=mask).float())
    torch.testing.assert_close(m(x, key_mask=mask), ref, rtol=1e-5, atol=1e-5)

    m = AftLocal(d, T, window=3, bias_rank=None, causal=causal)
    with torch.no_grad():
        m.pos_bias.weight.normal_()
    ref = m.proj(aft_local_reference(*_qkv(m, x), m.pos_bias.weight, 3, causal=causal, key_mask=mask).float())
    torch.testing.assert_close(m(x, key_mask=mask), ref, rtol=1e-5, atol=1e-5)

    m = AftSimple(d, causal=causal)
    ref = m.proj(aft_simple_reference(*_qkv(m, x), causal=causal, key_mask=mask).float())
    torch.testing.assert_close(m(x, key_mask=mask), ref, rtol=1e-5, atol=1e-5)

    m = AftConv1d(d, heads=2, kernel_size=5, causal=causal)
    with torch.no_grad():
        m.kernel.gamma.normal_()
        m.kernel.beta.normal_()
    ref = m.proj(aft_conv1d_reference(*_qkv(m, x), m.kernel(), causal=causal, key_mask=mask).float())
    torch.testing.assert_close(m(x, key_mask=mask), ref, rtol=1e-5, atol=1e-5)


def test_aftlocal_grid_window_matches_explicit_2d_bias():
    torch.manual_seed(2)
    d, H, W, win = 8, 4, 5, 2
    T = H * W
    m = AftLocal(d, T, window=win, bias_rank=4, grid_window=True)
    x = torch.randn(2, T, d)
    full = m.pos_bias.u @ m.pos_bias.v.t()
    w = torch.zeros(T, T)
    for t in range(T):
        for u in range(T):
            if abs(t // W - u // W) < win and abs(t % W - u % W) < win:
                w[t, u] = full[t, u]
    ref = m.proj(aft_full_reference(*_qkv(m, x), w).float())
    torch.testing.assert_close(m(x, hw=(H, W)), ref, rtol=1e-5, atol=1e-5)


def test_position_bias_per_row_positions():
    torch.manual_seed(3)
    pb = PositionBias(12, rank=3)
    pos = torch.tensor([[0, 1, 2, 3], [0, 0, 0, 1]])
    w = pb(4, pos)
    dense = pb.u @ pb.v.t()
    for b in range(2):
        for i in range(4):
            for j in range(4):
                torch.testing.assert_close(w[b, i, j], dense[pos[b, i], pos[b, j]])
    torch.testing.assert_close(pb(4), dense[:4, :4])
    with pytest.raises(ValueError, match="exceeds"):
        pb(13)
    assert pb.u.std().item() == pytest.approx(1e-2, rel=0.3)


def test_conv_kernel_standardisation():
    torch.manual_seed(4)
    k = ConvKernel(3, 5, ndim=2)
    assert torch.count_nonzero(k()) == 0  # gamma = beta = 0 at init
    with torch.no_grad():
        k.gamma.fill_(1.0)
        k.beta.copy_(torch.tensor([0.0, 1.0, -2.0]))
    w = k()
    for i in range(3):
        raw = k.weight[i]
        expected = (raw - raw.mean()) / torch.sqrt(raw.var(unbiased=False) + k.eps) + k.beta[i]
        torch.testing.assert_close(w[i], expected)
    with pytest.raises(ValueError, match="odd"):
        ConvKernel(2, 4)


@pytest.mark.parametrize("mixer", ["simple", "conv", "full"])
def test_block_checkpoint_identical_and_residual_structure(mixer):
    torch.manual_seed(5)
    d, H, W = 16, 3, 4
    mix = {"simple": lambda: AftSimple(d), "conv": lambda: AftConv(d, 4, 3), "full": lambda: AftFull(d, H * W, 4)}
    block = AftBlock(d, mix[mixer](), drop_path=0.0, init_values=0.1)
    x = torch.randn(2, H * W, d, requires_grad=True)
    y = block(x, hw=(H, W))
    g = torch.autograd.grad(y.square().sum(), [x] + list(block.parameters()))
    x2 = x.detach().clone().requires_grad_()
    y2 = checkpoint(block, x2, (H, W), use_reentrant=False)
    g2 = torch.autograd.grad(y2.square().sum(), [x2] + list(block.parameters()))
    assert torch.equal(y, y2)
    for a, b in zip(g, g2):
        assert torch.equal(a, b)
    # independent composition of the block's parts
    h = x + block.ls1(block.mixer(block.norm1(x), hw=(H, W)))
    expected = h + block.ls2(block.mlp(block.norm2(h)))
    torch.testing.assert_close(y, expected)


def test_block_drop_path_only_in_training():
    torch.manual_seed(6)
    block = AftBlock(8, AftSimple(8), drop_path=0.5)
    x = torch.randn(64, 4, 8)
    block.eval()
    assert torch.equal(block(x), block(x))
    block.train()
    y1, y2 = block(x), block(x)
    assert not torch.equal(y1, y2)
    assert torch.isfinite(y1).all()
