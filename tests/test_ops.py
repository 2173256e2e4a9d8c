"""Tests of the AFT operators in aft_hub.ops.functional (Zhai et al., arXiv:2105.14103).

Every test compares the fast operators with something independent of them: the float64 loop references of
aft_hub.ops.reference, or a formula written out here (explicit loops, torch.softmax, F.conv1d / F.conv2d).
The references themselves are checked against a scalar brute force (math.exp in plain Python loops).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aft_hub.ops import functional as aft
from aft_hub.ops import reference as ref

OPS = ("aft_full", "aft_simple", "aft_local", "aft_conv1d", "aft_conv2d")
CAUSAL_OPS = ("aft_full", "aft_simple", "aft_local", "aft_conv1d")
MASK_KINDS = (None, "right", "left", "holes", "empty_row")
HYPOTHESIS = settings(
    max_examples=30, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tensors here are tiny: intra-op threads only add start-up and synchronisation costs, which made this file
    several times slower on a loaded 2-core machine. The operators' results do not depend on the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------------------------------
# building cases
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One call of an operator: its inputs, in the layout of the fast operator."""

    op: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    param: torch.Tensor | None = None  # pos_bias (aft_full, aft_local) or weight (aft_conv1d, aft_conv2d)
    window: int | None = None
    causal: bool = False
    key_mask: torch.Tensor | None = None

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [x for x in (self.q, self.k, self.v, self.param) if x is not None]

    def with_tensors(self, tensors) -> Case:
        q, k, v, *rest = tensors
        return replace(self, q=q, k=k, v=v, param=rest[0] if rest else None)

    def call(self, impl: str, tensors=None) -> torch.Tensor:
        """Run the fast operator (impl "fast") or the float64 reference (impl "ref") on the case's inputs."""
        q, k, v, *rest = self.tensors if tensors is None else tensors
        p = rest[0] if rest else None
        if impl == "ref":
            q, k, v = q.double(), k.double(), v.double()
            p = None if p is None else p.double()
            fn = getattr(ref, f"{self.op}_reference")
        else:
            fn = getattr(aft, self.op)
        kw = {"causal": self.causal, "key_mask": self.key_mask}
        if self.op == "aft_simple":
            return fn(q, k, v, **kw)
        if self.op == "aft_local":
            return fn(q, k, v, p[: q.shape[1], : q.shape[1]] if impl == "ref" else p, self.window, **kw)
        if self.op == "aft_full":
            return fn(q, k, v, p[: q.shape[1], : q.shape[1]] if impl == "ref" else p, **kw)
        if self.op == "aft_conv1d":
            return fn(q, k, v, p, **kw)
        return fn(q, k, v, p)  # aft_conv2d: no causal mode, no key mask

    def no_key_rows(self) -> torch.Tensor | None:
        """(B, T) bool, rows that see no key at all (their output must be 0), or None without a key mask."""
        if self.key_mask is None:
            return None
        if self.causal:
            return self.key_mask.cumsum(dim=1) == 0
        return ~self.key_mask.any(dim=1, keepdim=True).expand_as(self.key_mask)


def make_mask(kind: str | None, B: int, T: int, gen: torch.Generator) -> torch.Tensor | None:
    """None, right padding, left padding, random holes, or random holes with one batch row fully masked."""
    if kind is None:
        return None
    pos = torch.arange(T)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    if kind == "right":
        return pos[None, :] < lengths[:, None]
    if kind == "left":
        return pos[None, :] >= (T - lengths)[:, None]
    mask = torch.rand(B, T, generator=gen) < 0.6
    if kind == "empty_row":
        mask[0] = False
    return mask


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def make_case(
    op: str,
    B: int = 2,
    T: int = 9,
    C: int = 6,
    *,
    seed: int = 0,
    causal: bool = False,
    mask: str | None = None,
    window: int = 3,
    heads: int = 2,
    kernel: int = 3,
    grid: tuple[int, int] = (3, 4),
    key_scale: float = 2.0,
    bias_scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> Case:
    """A random case. For aft_conv2d, T is ignored and the tokens form the (H, W) grid."""
    gen = torch.Generator().manual_seed(seed)
    if op == "aft_conv2d":
        H, W = grid
        q, v = randn(gen, B, C, H, W, dtype=dtype), randn(gen, B, C, H, W, dtype=dtype)
        k = randn(gen, B, heads, H, W, scale=key_scale, dtype=dtype)
        weight = randn(gen, heads, kernel, kernel, scale=bias_scale, dtype=dtype)
        return Case(op, q, k, v, weight)
    q, v = randn(gen, B, T, C, dtype=dtype), randn(gen, B, T, C, dtype=dtype)
    k = randn(gen, B, T, heads if op == "aft_conv1d" else C, scale=key_scale, dtype=dtype)
    key_mask = make_mask(mask, B, T, gen)
    if op == "aft_simple":
        param = None
    elif op == "aft_conv1d":
        param = randn(gen, heads, kernel, scale=bias_scale, dtype=dtype)
    else:
        param = randn(gen, T, T, scale=bias_scale, dtype=dtype)
    return Case(op, q, k, v, param, window=window, causal=causal, key_mask=key_mask)


def assert_matches_reference(case: Case, y: torch.Tensor | None = None, tol: float = 1e-5) -> None:
    """The fast output is finite, has the dtype of q, rows without keys are 0, and it matches the float64 reference
    within tol, relative to the scale of v (|Y| <= max |v|)."""
    if y is None:
        y = case.call("fast")
    expected = case.call("ref")
    assert y.dtype == case.q.dtype
    assert y.shape == case.q.shape
    assert torch.isfinite(y).all()
    empty = case.no_key_rows()
    if empty is not None:
        assert (y[empty] == 0).all(), "rows that see no key must be exactly 0"
    scale = max(case.v.double().abs().max().item(), 1e-30)
    torch.testing.assert_close(y.double(), expected, rtol=tol, atol=tol * scale)


# ----------------------------------------------------------------------------------------------------------------
# each operator against its float64 reference
# ----------------------------------------------------------------------------------------------------------------

SHAPES_1D = [(1, 1, 1), (1, 1, 5), (2, 1, 3), (1, 7, 3), (3, 13, 5), (2, 33, 4), (2, 64, 2), (1, 100, 3)]


@pytest.mark.parametrize("mask", MASK_KINDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,T,C", SHAPES_1D)
def test_aft_simple_matches_reference(B: int, T: int, C: int, causal: bool, mask: str | None) -> None:
    assert_matches_reference(make_case("aft_simple", B, T, C, causal=causal, mask=mask, seed=T * 7 + C))


@pytest.mark.parametrize("mask", MASK_KINDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,T,C", SHAPES_1D)
def test_aft_full_matches_reference(B: int, T: int, C: int, causal: bool, mask: str | None) -> None:
    assert_matches_reference(make_case("aft_full", B, T, C, causal=causal, mask=mask, seed=T * 7 + C))


@pytest.mark.parametrize("causal", [False, True])
def test_aft_full_larger_pos_bias_uses_top_left_block(causal: bool) -> None:
    case = make_case("aft_full", 2, 11, 3, causal=causal, mask="holes", seed=3)
    gen = torch.Generator().manual_seed(4)
    big = randn(gen, 16, 14)
    big[:11, :11] = case.param
    y = aft.aft_full(case.q, case.k, case.v, big, causal=causal, key_mask=case.key_mask)
    assert_matches_reference(case, y)


@pytest.mark.parametrize("mask", MASK_KINDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [1, 2, 3, 8, 12, 13, 14, 40])
@pytest.mark.parametrize("B,T,C", [(1, 1, 3), (2, 13, 3), (2, 36, 2)])
def test_aft_local_matches_reference(B: int, T: int, C: int, window: int, causal: bool, mask: str | None) -> None:
    case = make_case("aft_local", B, T, C, causal=causal, mask=mask, window=window, seed=window * 31 + T)
    assert_matches_reference(case)


@pytest.mark.parametrize("mask", MASK_KINDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", [1, 3, 5, 31])
@pytest.mark.parametrize(
    "B,T,C,heads", [(1, 1, 1, 1), (2, 9, 6, 1), (2, 9, 6, 2), (2, 9, 6, 6), (1, 20, 4, 4), (3, 33, 8, 2)]
)
def test_aft_conv1d_matches_reference(
    B: int, T: int, C: int, heads: int, kernel: int, causal: bool, mask: str | None
) -> None:
    case = make_case("aft_conv1d", B, T, C, heads=heads, kernel=kernel, causal=causal, mask=mask, seed=T + kernel)
    assert_matches_reference(case)


@pytest.mark.parametrize("kernel", [1, 3, 5, 9])
@pytest.mark.parametrize(
    "B,C,heads,grid", [(1, 1, 1, (1, 1)), (2, 4, 1, (3, 5)), (2, 6, 2, (4, 4)), (1, 6, 6, (7, 2)), (2, 4, 2, (9, 6))]
)
def test_aft_conv2d_matches_reference(B: int, C: int, heads: int, grid: tuple[int, int], kernel: int) -> None:
    case = make_case("aft_conv2d", B, C=C, heads=heads, kernel=kernel, grid=grid, seed=kernel + grid[0] * 10)
    assert_matches_reference(case)


@pytest.mark.parametrize("op", OPS)
def test_ops_accept_non_contiguous_inputs(op: str) -> None:
    case = make_case(op, 2, 10, 4, causal=op != "aft_conv2d", mask="holes" if op != "aft_conv2d" else None, seed=5)
    # the same values, laid out transposed in memory
    tensors = [x.transpose(-1, -2).contiguous().transpose(-1, -2) for x in case.tensors]
    assert not tensors[0].is_contiguous()
    assert_matches_reference(case, case.call("fast", tensors))


@pytest.mark.parametrize("op", ["aft_full", "aft_local"])
@pytest.mark.parametrize("causal", [False, True])
def test_batched_pos_bias_matches_per_sample_reference(op: str, causal: bool) -> None:
    """A (B, T, T) pos_bias applies pos_bias[b] to sample b (skipped while the operators take (T, T) only)."""
    B, T, C = 3, 10, 4
    case = make_case(op, B, T, C, causal=causal, mask="left", seed=12, window=3)
    gen = torch.Generator().manual_seed(13)
    bias = randn(gen, B, T, T)
    try:
        y = case.call("fast", [case.q, case.k, case.v, bias])
    except (ValueError, TypeError) as err:
        pytest.skip(f"batched pos_bias is not supported: {err}")
    for b in range(B):
        one = replace(
            case,
            q=case.q[b : b + 1],
            k=case.k[b : b + 1],
            v=case.v[b : b + 1],
            param=bias[b],
            key_mask=case.key_mask[b : b + 1],
        )
        assert_matches_reference(one, y[b : b + 1])


# property-based: random shapes, windows, kernels, heads and masks (a fixed, derandomised budget)


@HYPOTHESIS
@given(
    op=st.sampled_from(("aft_full", "aft_simple", "aft_local", "aft_conv1d")),
    B=st.integers(1, 3),
    T=st.integers(1, 40),
    D=st.integers(1, 3),
    heads=st.integers(1, 4),
    window=st.integers(1, 45),
    kernel_radius=st.integers(0, 22),
    causal=st.booleans(),
    mask=st.sampled_from(MASK_KINDS),
    key_scale=st.sampled_from([0.1, 1.0, 5.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def test_1d_ops_match_reference_property(
    op: str,
    B: int,
    T: int,
    D: int,
    heads: int,
    window: int,
    kernel_radius: int,
    causal: bool,
    mask: str | None,
    key_scale: float,
    seed: int,
) -> None:
    case = make_case(
        op,
        B,
        T,
        heads * D,
        heads=heads,
        window=window,
        kernel=2 * kernel_radius + 1,
        causal=causal,
        mask=mask,
        key_scale=key_scale,
        seed=seed,
    )
    assert_matches_reference(case)


@HYPOTHESIS
@given(
    B=st.integers(1, 2),
    H=st.integers(1, 8),
    W=st.integers(1, 8),
    D=st.integers(1, 3),
    heads=st.integers(1, 3),
    kernel_radius=st.integers(0, 5),
    key_scale=st.sampled_from([0.1, 1.0, 5.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def test_aft_conv2d_matches_reference_property(
    B: int, H: int, W: int, D: int, heads: int, kernel_radius: int, key_scale: float, seed: int
) -> None:
    case = make_case(
        "aft_conv2d",
        B,
        C=heads * D,
        heads=heads,
        kernel=2 * kernel_radius + 1,
        grid=(H, W),
        key_scale=key_scale,
        seed=seed,
    )
    assert_matches_reference(case)


# ----------------------------------------------------------------------------------------------------------------
# the references against independent formulas
# ----------------------------------------------------------------------------------------------------------------


def brute_force(q, k, v, bias, visible) -> torch.Tensor:
    """Y[b, t, c] = sigmoid(q) * sum_t' exp(k + w) v / sum_t' exp(k + w) over visible t', in plain Python floats.

    Args:
        q, v: (B, T, C); k: (B, T, C) (already one key per channel).
        bias: bias(t, t2, c) -> float, the position bias w[t, t2] of channel c.
        visible: visible(b, t, t2) -> bool.
    """
    B, T, C = q.shape
    q, k, v = q.tolist(), k.tolist(), v.tolist()
    out = torch.zeros(B, T, C, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            for c in range(C):
                num = den = 0.0
                for t2 in range(T):
                    if visible(b, t, t2):
                        e = math.exp(k[b][t2][c] + bias(t, t2, c))
                        num += e * v[b][t2][c]
                        den += e
                if den > 0:
                    out[b, t, c] = num / den / (1.0 + math.exp(-q[b][t][c]))
    return out


def visibility(case: Case):
    mask = None if case.key_mask is None else case.key_mask.tolist()
    return lambda b, t, t2: (mask is None or mask[b][t2]) and (not case.causal or t2 <= t)


@pytest.mark.parametrize("mask", [None, "holes", "empty_row"])
@pytest.mark.parametrize("causal", [False, True])
def test_aft_full_reference_matches_brute_force(causal: bool, mask: str | None) -> None:
    case = make_case("aft_full", 2, 7, 3, causal=causal, mask=mask, seed=21)
    w = case.param.tolist()
    expected = brute_force(case.q, case.k, case.v, lambda t, t2, c: w[t][t2], visibility(case))
    torch.testing.assert_close(case.call("ref"), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mask", [None, "left"])
@pytest.mark.parametrize("causal", [False, True])
def test_aft_simple_reference_matches_softmax_formula(causal: bool, mask: str | None) -> None:
    """sigmoid(Q_t) * sum_t' softmax_t'(K)_t' V_t', the softmax over the visible keys (torch.softmax per row)."""
    case = make_case("aft_simple", 3, 8, 4, causal=causal, mask=mask, seed=22)
    q, k, v = case.q.double(), case.k.double(), case.v.double()
    B, T, C = q.shape
    expected = torch.zeros(B, T, C, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            keys = [t2 for t2 in range(T) if visibility(case)(b, t, t2)]
            if keys:
                weights = torch.softmax(k[b, keys], dim=0)  # (len(keys), C), over time per channel
                expected[b, t] = torch.sigmoid(q[b, t]) * (weights * v[b, keys]).sum(dim=0)
    torch.testing.assert_close(case.call("ref"), expected, rtol=1e-12, atol=1e-12)
    expected_bf = brute_force(case.q, case.k, case.v, lambda t, t2, c: 0.0, visibility(case))
    torch.testing.assert_close(expected, expected_bf, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("window", [1, 2, 4, 7, 9])
@pytest.mark.parametrize("causal", [False, True])
def test_aft_local_reference_matches_brute_force(window: int, causal: bool) -> None:
    """Inside the window (|t - t'| < s) the bias is pos_bias[t, t'], outside it is 0 (not -inf)."""
    case = make_case("aft_local", 2, 7, 2, causal=causal, mask="holes", window=window, seed=23)
    w = case.param.tolist()
    bias = lambda t, t2, c: w[t][t2] if abs(t - t2) < window else 0.0  # noqa: E731
    expected = brute_force(case.q, case.k, case.v, bias, visibility(case))
    torch.testing.assert_close(case.call("ref"), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_aft_local_reference_with_wide_window_equals_full_reference(causal: bool) -> None:
    case = make_case("aft_local", 2, 9, 3, causal=causal, mask="right", window=9, seed=24)
    full = replace(case, op="aft_full")
    torch.testing.assert_close(case.call("ref"), full.call("ref"), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("heads", [1, 2, 6])
@pytest.mark.parametrize("causal", [False, True])
def test_aft_conv1d_reference_matches_brute_force(heads: int, causal: bool) -> None:
    """Head i's key at offset o = t' - t has bias weight[i, o + s // 2] for |o| <= s // 2, else 0."""
    case = make_case("aft_conv1d", 2, 8, 6, heads=heads, kernel=5, causal=causal, mask="holes", seed=25)
    D, r = 6 // heads, 2
    w = case.param.tolist()
    bias = lambda t, t2, c: w[c // D][t2 - t + r] if abs(t2 - t) <= r else 0.0  # noqa: E731
    k = case.k.repeat_interleave(D, dim=-1)  # head i's key for its D channels
    expected = brute_force(case.q, k, case.v, bias, visibility(case))
    torch.testing.assert_close(case.call("ref"), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("heads", [1, 2])
def test_aft_conv2d_reference_equals_full_reference_with_dense_bias(heads: int) -> None:
    """Per head: AFT-full on the flattened grid with w[t, t'] = weight[i, di + r, dj + r] inside the kernel."""
    H, W, C, s = 4, 5, 4, 3
    case = make_case("aft_conv2d", 2, C=C, heads=heads, kernel=s, grid=(H, W), seed=26)
    D, r = C // heads, s // 2
    flat = lambda x: x.flatten(2).transpose(1, 2)  # (B, C, H, W) -> (B, H * W, C)  # noqa: E731
    parts = []
    for i in range(heads):
        dense = torch.zeros(H * W, H * W, dtype=torch.float64)
        for t in range(H * W):
            for t2 in range(H * W):
                di, dj = t2 // W - t // W, t2 % W - t % W
                if abs(di) <= r and abs(dj) <= r:
                    dense[t, t2] = case.param[i, di + r, dj + r].double()
        ch = slice(i * D, (i + 1) * D)
        k = flat(case.k[:, i : i + 1]).expand(-1, -1, D)
        parts.append(ref.aft_full_reference(flat(case.q[:, ch]).double(), k.double(), flat(case.v[:, ch]).double(),
                                            dense))  # fmt: skip
    expected = torch.cat(parts, dim=-1).transpose(1, 2).reshape(2, C, H, W)
    torch.testing.assert_close(case.call("ref"), expected, rtol=1e-12, atol=1e-12)


def _kernel_only_formula(q, v, weight, conv):
    """With k = 0 and a kernel covering every key: Y = sigmoid(q) * conv(v, exp w) / conv(1, exp w) per head."""
    heads, C = weight.shape[0], q.shape[1]
    D = C // heads
    kernel = torch.exp(weight.double()).repeat_interleave(D, dim=0).unsqueeze(1)  # (C, 1, s[, s])
    r = weight.shape[-1] // 2
    num = conv(v.double(), kernel, padding=r, groups=C)
    den = conv(torch.ones_like(v, dtype=torch.float64), kernel, padding=r, groups=C)
    return torch.sigmoid(q.double()) * num / den


def test_aft_conv2d_kernel_orientation_matches_f_conv2d() -> None:
    """The kernel is laid out like F.conv2d(..., padding=s // 2): checked on reference and fast path alike."""
    B, C, heads, H, W, s = 2, 4, 2, 4, 5, 11  # s // 2 >= H, W: every key inside the kernel
    case = make_case("aft_conv2d", B, C=C, heads=heads, kernel=s, grid=(H, W), seed=27)
    case.k = torch.zeros_like(case.k)
    expected = _kernel_only_formula(case.q, case.v, case.param, F.conv2d)
    torch.testing.assert_close(case.call("ref"), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(case.call("fast").double(), expected, rtol=1e-5, atol=1e-5)


def test_aft_conv1d_kernel_orientation_matches_f_conv1d() -> None:
    B, T, C, heads, s = 2, 6, 4, 2, 13
    case = make_case("aft_conv1d", B, T, C, heads=heads, kernel=s, seed=28)
    case.k = torch.zeros_like(case.k)
    t = lambda x: x.transpose(1, 2)  # (B, T, C) <-> (B, C, T)  # noqa: E731
    expected = t(_kernel_only_formula(t(case.q), t(case.v), case.param, F.conv1d))
    torch.testing.assert_close(case.call("ref"), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(case.call("fast").double(), expected, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# causality
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask", [None, "holes", "left"])
@pytest.mark.parametrize("t0", [0, 5, 16, 30])
@pytest.mark.parametrize("op", CAUSAL_OPS)
def test_causal_ops_ignore_the_future(op: str, t0: int, mask: str | None) -> None:
    """Changing q, k, v at t > t0, the biases of future keys and of later rows, to anything (keys up to 1e3) leaves
    the outputs at t <= t0 bit-for-bit unchanged."""
    B, T, C = 2, 32, 4
    case = make_case(op, B, T, C, causal=True, mask=mask, window=5, kernel=7, heads=2, seed=40 + t0)
    y = case.call("fast")
    gen = torch.Generator().manual_seed(t0)
    future = slice(t0 + 1, None)
    for scale in (1.0, 1e3):
        q, k, v = case.q.clone(), case.k.clone(), case.v.clone()
        q[:, future] = randn(gen, *q[:, future].shape, scale=scale)
        k[:, future] = randn(gen, *k[:, future].shape, scale=scale)
        v[:, future] = randn(gen, *v[:, future].shape, scale=scale)
        tensors = [q, k, v]
        if op in ("aft_full", "aft_local"):
            w = case.param.clone()
            w[:, future] = randn(gen, T, T - t0 - 1, scale=10.0)  # biases of keys after t0
            w[future, :] = randn(gen, T - t0 - 1, T, scale=10.0)  # rows after t0
            w[: t0 + 1].triu_(1).mul_(50.0).add_(case.param[: t0 + 1].tril())  # biases above the diagonal
            tensors.append(w)
        elif op == "aft_conv1d":
            w = case.param.clone()
            w[:, w.shape[1] // 2 + 1 :] = 50.0  # kernel offsets t' > t
            tensors.append(w)
        y2 = case.call("fast", tensors)
        assert torch.isfinite(y2).all()
        past, past2 = y[:, : t0 + 1], y2[:, : t0 + 1]
        torch.testing.assert_close(past2, past, rtol=1e-5, atol=1e-5, msg="the future leaks into the past")
        diff = (past2 - past).abs().max().item()
        assert torch.equal(past, past2), f"outputs at t <= t0 depend on the future at rounding level (max {diff:.2e})"


# ----------------------------------------------------------------------------------------------------------------
# numerical stability
# ----------------------------------------------------------------------------------------------------------------


def extreme_keys(kind: str, shape: tuple[int, ...], time_dim: int, gen: torch.Generator) -> torch.Tensor:
    """Keys of magnitude up to 1e3: uniform random, or ascending / descending -1000..1000 along time."""
    if kind == "random":
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * 1e3
    T = shape[time_dim]
    ramp = torch.linspace(-1e3, 1e3, T, dtype=torch.float64)
    if kind == "descending":
        ramp = ramp.flip(0)
    view = [1] * len(shape)
    view[time_dim] = T
    return ramp.view(view) + torch.rand(shape, generator=gen, dtype=torch.float64) * 5.0  # ties broken at random


def extreme_case(op: str, kind: str, causal: bool, mask: str | None, dtype: torch.dtype, seed: int = 0) -> Case:
    """Keys up to |1e3|, biases up to |10|; masked keys get +1e4 so that a wrong maximum would show."""
    case = make_case(op, 2, 23, 4, causal=causal, mask=mask, window=4, kernel=5, heads=2, grid=(4, 5), seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    time_dim = 1
    k_shape = case.k.shape
    if op == "aft_conv2d":  # time runs over the flattened grid
        k = extreme_keys(kind, (k_shape[0], k_shape[1], k_shape[2] * k_shape[3]), 2, gen).view(k_shape)
    else:
        k = extreme_keys(kind, tuple(k_shape), time_dim, gen)
    if case.key_mask is not None:
        k = torch.where(case.key_mask.unsqueeze(-1), k, torch.full_like(k, 1e4))
    case.k = k
    if case.param is not None:
        case.param = (torch.rand(case.param.shape, generator=gen, dtype=torch.float64) * 2 - 1) * 10.0
    return case.with_tensors([x.to(dtype) for x in case.tensors])


EXTREME_PARAMS = [
    (op, kind, causal, mask)
    for op in OPS
    for kind in ("random", "ascending", "descending")
    for causal in ((False, True) if op in CAUSAL_OPS else (False,))
    for mask in ((None, "holes") if op != "aft_conv2d" else (None,))
]


@pytest.mark.parametrize("op,kind,causal,mask", EXTREME_PARAMS)
def test_ops_stable_for_extreme_keys_float32(op: str, kind: str, causal: bool, mask: str | None) -> None:
    assert_matches_reference(extreme_case(op, kind, causal, mask, torch.float32), tol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op,kind,causal,mask", EXTREME_PARAMS)
def test_ops_stable_for_extreme_keys_half(op: str, kind: str, causal: bool, mask: str | None, dtype) -> None:
    """Half inputs: the output has the input dtype, is finite and matches the reference on the same (rounded)
    inputs within the dtype's resolution."""
    case = extreme_case(op, kind, causal, mask, dtype)
    eps = torch.finfo(dtype).eps
    assert_matches_reference(case, tol=eps)


def _loss_grads(case: Case, impl: str, tensors: list[torch.Tensor], seed: int = 99) -> list[torch.Tensor]:
    y = case.call(impl, tensors)
    gen = torch.Generator().manual_seed(seed)
    cotangent = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    return torch.autograd.grad((y.double() * cotangent).sum(), tensors)


@pytest.mark.parametrize("op,kind,causal,mask", [p for p in EXTREME_PARAMS if p[3] is None] + [
    (op, "random", causal, "right") for op in CAUSAL_OPS for causal in (False, True)
])  # fmt: skip
def test_ops_gradients_stable_for_extreme_keys(op: str, kind: str, causal: bool, mask: str | None) -> None:
    """Backward through the extreme cases: finite gradients, equal to the float64 reference's."""
    case = extreme_case(op, kind, causal, mask, torch.float32)
    fast = [x.detach().requires_grad_(True) for x in case.tensors]
    slow = [x.detach().double().requires_grad_(True) for x in case.tensors]
    grads = _loss_grads(case, "fast", fast)
    expected = _loss_grads(case, "ref", slow)
    for g, e, x in zip(grads, expected, fast):
        assert g.dtype == x.dtype
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-4 * max(e.abs().max().item(), 1.0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op,kind,causal,mask", EXTREME_PARAMS)
def test_ops_gradients_finite_for_extreme_keys_half(op: str, kind: str, causal: bool, mask: str | None, dtype) -> None:
    case = extreme_case(op, kind, causal, mask, dtype)
    tensors = [x.detach().requires_grad_(True) for x in case.tensors]
    grads = _loss_grads(case, "fast", tensors)
    assert len(grads) == len(tensors)
    for g in grads:
        assert g.dtype == dtype
        assert torch.isfinite(g).all()


# ----------------------------------------------------------------------------------------------------------------
# gradients: float64 gradcheck (finite differences) for q, k, v and the bias / kernel
# ----------------------------------------------------------------------------------------------------------------

GRADCHECK_PARAMS = [(op, causal, mask) for op in CAUSAL_OPS for causal in (False, True) for mask in (None, "holes")]
GRADCHECK_PARAMS += [(op, True, "left") for op in CAUSAL_OPS] + [(op, False, "empty_row") for op in CAUSAL_OPS]
GRADCHECK_PARAMS += [("aft_conv2d", False, None)]


@pytest.mark.parametrize("op,causal,mask", GRADCHECK_PARAMS)
def test_ops_gradcheck_float64(op: str, causal: bool, mask: str | None) -> None:
    """Every entry of the Jacobian (q, k, v and the bias / kernel) against central finite differences."""
    case = make_case(op, 2, 5, 4, causal=causal, mask=mask, window=2, kernel=3, heads=2, grid=(2, 3), seed=50,
                     dtype=torch.float64)  # fmt: skip
    tensors = tuple(x.detach().requires_grad_(True) for x in case.tensors)
    assert torch.autograd.gradcheck(
        lambda *xs: case.call("fast", list(xs)), tensors, eps=1e-6, atol=1e-6, rtol=1e-4, fast_mode=False
    )


# ----------------------------------------------------------------------------------------------------------------
# memory: O(T) at fixed window
# ----------------------------------------------------------------------------------------------------------------


def _peak_bytes(fn) -> int:
    from aft_hub.bench import peak_memory_bytes

    return peak_memory_bytes(fn)


def test_peak_memory_measure_on_known_allocations() -> None:
    """The profiler-based peak used below: a, b allocated, a freed, c allocated -> peak |b| + |c|."""

    def allocate() -> None:
        a = torch.empty(3_000_000, dtype=torch.uint8)
        b = torch.empty(1_000_000, dtype=torch.uint8)
        del a
        c = torch.empty(5_000_000, dtype=torch.uint8)
        del b, c

    assert _peak_bytes(allocate) == 6_000_000
    x = torch.randn(1000, 1000, requires_grad=True)  # 4 MB; exp keeps its output (4 MB) for the backward
    assert 8_000_000 <= _peak_bytes(lambda: torch.autograd.grad(x.exp().sum(), [x])) <= 13_000_000


def _fwd_bwd_peak(op: str, T: int, causal: bool, C: int = 32, window: int = 32) -> int:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, T, C, generator=gen).requires_grad_(True) for _ in range(3))
    if op == "aft_local":
        pos_bias = torch.randn(T, T, generator=gen) * 0.1  # a constant here: a learned one has a (T, T) gradient

        def run():
            return torch.autograd.grad(aft.aft_local(q, k, v, pos_bias, window, causal=causal).sum(), [q, k, v])
    else:

        def run():
            return torch.autograd.grad(aft.aft_simple(q, k, v, causal=causal).sum(), [q, k, v])

    run()  # warm-up
    return _peak_bytes(run)


@pytest.mark.parametrize("op,causal", [("aft_local", False), ("aft_local", True), ("aft_simple", True)])
def test_ops_memory_linear_in_seq_len(op: str, causal: bool) -> None:
    """Forward + backward peak memory at T = 2048 and 8192 (C = 32, window 32): ~4x, not ~16x."""
    small, large = _fwd_bwd_peak(op, 2048, causal), _fwd_bwd_peak(op, 8192, causal)
    ratio = large / small
    assert 3.0 <= ratio <= 5.5, f"peak {small} -> {large} bytes, ratio {ratio:.2f}"
    assert large < 8192 * 8192 * 4 / 4, "a quarter of one (T, T) float32 matrix"


# ----------------------------------------------------------------------------------------------------------------
# input validation
# ----------------------------------------------------------------------------------------------------------------


def _x(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


B_, T_, C_ = 2, 5, 4
INVALID_CALLS = [
    # (id, call, exception, a word the message must contain)
    ("q_2d", lambda: aft.aft_simple(_x(T_, C_), _x(T_, C_), _x(T_, C_)), ValueError, "q"),
    ("v_shape", lambda: aft.aft_simple(_x(B_, T_, C_), _x(B_, T_, C_), _x(B_, T_, C_ + 1)), ValueError, "v"),
    ("k_shape", lambda: aft.aft_simple(_x(B_, T_, C_), _x(B_, T_ + 1, C_), _x(B_, T_, C_)), ValueError, "k"),
    ("q_not_tensor", lambda: aft.aft_simple([[[0.0]]], _x(1, 1, 1), _x(1, 1, 1)), TypeError, "q"),
    ("q_integer", lambda: aft.aft_simple(_x(1, 1, 1, dtype=torch.int64), _x(1, 1, 1), _x(1, 1, 1)), TypeError, "q"),
    ("full_bias_small", lambda: aft.aft_full(_x(B_, T_, C_), _x(B_, T_, C_), _x(B_, T_, C_), _x(T_ - 1, T_)),
     ValueError, "pos_bias"),
    ("full_bias_1d", lambda: aft.aft_full(_x(B_, T_, C_), _x(B_, T_, C_), _x(B_, T_, C_), _x(T_)),
     ValueError, "pos_bias"),
    ("full_bias_wrong_batch", lambda: aft.aft_full(_x(B_, T_, C_), _x(B_, T_, C_), _x(B_, T_, C_), _x(B_ + 1, T_, T_)),
     ValueError, "pos_bias"),
    ("local_window_0", lambda: aft.aft_local(_x(B_, T_, C_), _x(B_, T_, C_), _x(B_, T_, C_), _x(T_, T_), 0),
     ValueError, "window"),
    ("local_window_negative", lambda: aft.aft_local(_x(B_, T_, C_), _x(B_, T_, C_), _x(B_, T_, C_), _x(T_, T_), -2),
     ValueError, "window"),
    ("local_window_float", lambda: aft.aft_local(_x(B_, T_, C_), _x(B_, T_, C_), _x(B_, T_, C_), _x(T_, T_), 2.5),
     (TypeError, ValueError), "window"),
    ("local_bias_small", lambda: aft.aft_local(_x(B_, T_, C_), _x(B_, T_, C_), _x(B_, T_, C_), _x(T_, T_ - 1), 2),
     ValueError, "pos_bias"),
    ("conv1d_even_kernel", lambda: aft.aft_conv1d(_x(B_, T_, C_), _x(B_, T_, 2), _x(B_, T_, C_), _x(2, 4)),
     ValueError, "odd"),
    ("conv1d_heads_mismatch", lambda: aft.aft_conv1d(_x(B_, T_, C_), _x(B_, T_, 2), _x(B_, T_, C_), _x(4, 3)),
     ValueError, "head"),
    ("conv1d_channels_not_divisible", lambda: aft.aft_conv1d(_x(B_, T_, 5), _x(B_, T_, 2), _x(B_, T_, 5), _x(2, 3)),
     ValueError, "divisible"),
    ("conv2d_even_kernel", lambda: aft.aft_conv2d(_x(B_, C_, 3, 3), _x(B_, 2, 3, 3), _x(B_, C_, 3, 3), _x(2, 4, 4)),
     ValueError, "odd"),
    ("conv2d_non_square_kernel",
     lambda: aft.aft_conv2d(_x(B_, C_, 3, 3), _x(B_, 2, 3, 3), _x(B_, C_, 3, 3), _x(2, 3, 5)), ValueError, "weight"),
    ("conv2d_k_shape", lambda: aft.aft_conv2d(_x(B_, C_, 3, 3), _x(B_, 3, 3, 3), _x(B_, C_, 3, 3), _x(2, 3, 3)),
     ValueError, "k"),
    ("conv2d_3d_input", lambda: aft.aft_conv2d(_x(B_, C_, 9), _x(B_, 2, 9), _x(B_, C_, 9), _x(2, 3, 3)),
     ValueError, "q"),
]  # fmt: skip

MASK_CALLS = {
    "aft_simple": lambda m: aft.aft_simple(_x(B_, T_, C_), _x(B_, T_, C_), _x(B_, T_, C_), key_mask=m),
    "aft_full": lambda m: aft.aft_full(_x(B_, T_, C_), _x(B_, T_, C_), _x(B_, T_, C_), _x(T_, T_), key_mask=m),
    "aft_local": lambda m: aft.aft_local(_x(B_, T_, C_), _x(B_, T_, C_), _x(B_, T_, C_), _x(T_, T_), 2, key_mask=m),
    "aft_conv1d": lambda m: aft.aft_conv1d(_x(B_, T_, C_), _x(B_, T_, 2), _x(B_, T_, C_), _x(2, 3), key_mask=m),
}
for _op, _call in MASK_CALLS.items():
    INVALID_CALLS += [
        (f"{_op}_mask_float", lambda c=_call: c(torch.ones(B_, T_)), TypeError, "key_mask"),
        (f"{_op}_mask_int", lambda c=_call: c(torch.ones(B_, T_, dtype=torch.int64)), TypeError, "key_mask"),
        (f"{_op}_mask_shape", lambda c=_call: c(torch.ones(B_, T_ + 1, dtype=torch.bool)), ValueError, "key_mask"),
    ]


@pytest.mark.parametrize("call,exception,word", [c[1:] for c in INVALID_CALLS], ids=[c[0] for c in INVALID_CALLS])
def test_ops_reject_invalid_input(call, exception, word: str) -> None:
    with pytest.raises(exception) as info:
        call()
    message = str(info.value)
    assert len(message) > 10, "the error needs a sentence a user understands"
    assert re.search(rf"\b{word}\b", message, flags=re.IGNORECASE), f"the message should name {word!r}: {message!r}"
