"""Causal decoding (aft_hub.ops.decode) against the causal parallel operators and the float64 references."""

from __future__ import annotations

import math

import pytest
import torch

from aft_hub.ops import (
    aft_conv1d,
    aft_conv1d_reference,
    aft_full,
    aft_full_reference,
    aft_local,
    aft_local_reference,
    aft_simple,
    aft_simple_reference,
)
from aft_hub.ops.decode import (
    AFTDecodeState,
    AFTFullDecodeState,
    aft_conv1d_prefill_state,
    aft_conv1d_step,
    aft_full_prefill_state,
    aft_full_step,
    aft_local_prefill_state,
    aft_local_step,
    aft_local_step_bias,
    aft_simple_prefill_state,
    aft_simple_step,
)

C = 6  # channels in most tests

# (variant, window or kernel size, heads): heads only matters for conv1d; windows 1 and >= T included
CONFIGS = [
    ("simple", None, None),
    ("local", 1, None),
    ("local", 3, None),
    ("local", 64, None),
    ("conv1d", 1, 2),
    ("conv1d", 5, 1),
    ("conv1d", 3, C),
    ("conv1d", 81, 3),
    ("full", None, None),
]
CONFIG_IDS = [f"{v}-{p}-{h}" for v, p, h in CONFIGS]


# ----------------------------------------------------------------------------------------------------------------
# helpers: one problem = inputs + the parameters of its variant; stepping, parallel and reference runs of it
# ----------------------------------------------------------------------------------------------------------------


def make_problem(variant, param, heads, B, T, *, seed=0, dtype=torch.float32, batched_bias=False, bias_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q, v = torch.randn(2, B, T, C, generator=g, dtype=torch.float64).to(dtype).unbind(0)
    key_ch = heads if variant == "conv1d" else C
    k = torch.randn(B, T, key_ch, generator=g, dtype=torch.float64).to(dtype)
    prob = {"variant": variant, "q": q, "k": k, "v": v}
    if variant in ("local", "full"):
        shape = (B, T, T) if batched_bias else (T, T)
        prob["pos_bias"] = (bias_scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)
        prob["window"] = param
    elif variant == "conv1d":
        prob["weight"] = (bias_scale * torch.randn(heads, param, generator=g, dtype=torch.float64)).to(dtype)
    return prob


def make_mask(kind, B, T, seed=1):
    if kind is None:
        return None
    pads = [0, 2, 3, T][:B] + [1] * max(0, B - 4)
    pos = torch.arange(T)
    mask = torch.stack([pos >= min(p, T) for p in pads])  # left padding
    if kind == "holes":
        g = torch.Generator().manual_seed(seed)
        mask &= torch.rand(B, T, generator=g) > 0.3
    return mask


def step_bias(prob, t):
    """bias_t built independently of aft_local_step_bias; the entries before the sequence start are NaN (ignored)."""
    pb = prob["pos_bias"]
    if prob["variant"] == "full":
        return pb[..., t, : t + 1]
    window = prob["window"]
    out = torch.full(pb.shape[:-2] + (window,), float("nan"), dtype=pb.dtype)
    for o in range(min(window, t + 1)):
        out[..., o] = pb[..., t, t - o]
    return out


def run_steps(prob, key_mask=None, state=None, start=0, stop=None):
    """Step through positions start .. stop - 1 (state must hold the tokens before start)."""
    variant, q, k, v = prob["variant"], prob["q"], prob["k"], prob["v"]
    stop = q.shape[1] if stop is None else stop
    ys = []
    for t in range(start, stop):
        km = None if key_mask is None else key_mask[:, t]
        args = (q[:, t], k[:, t], v[:, t])
        if variant == "simple":
            y, state = aft_simple_step(*args, state, key_mask_t=km)
        elif variant == "local":
            y, state = aft_local_step(*args, step_bias(prob, t), prob["window"], state, key_mask_t=km)
        elif variant == "conv1d":
            y, state = aft_conv1d_step(*args, prob["weight"], state, key_mask_t=km)
        else:
            y, state = aft_full_step(*args, step_bias(prob, t), state, key_mask_t=km)
        ys.append(y)
    return torch.stack(ys, dim=1), state


def prefill(prob, T, key_mask=None):
    variant, k, v = prob["variant"], prob["k"][:, :T], prob["v"][:, :T]
    km = None if key_mask is None else key_mask[:, :T]
    if variant == "simple":
        return aft_simple_prefill_state(k, v, km)
    if variant == "local":
        return aft_local_prefill_state(k, v, prob["window"], key_mask=km)
    if variant == "conv1d":
        return aft_conv1d_prefill_state(k, v, prob["weight"], km)
    return aft_full_prefill_state(k, v, key_mask=km)


def _per_batch(fn, prob, key_mask, **kw):
    """Run fn per batch element when pos_bias is batched (B, T, T)."""
    pb = prob.get("pos_bias")
    if pb is None or pb.dim() == 2:
        return fn(prob["q"], prob["k"], prob["v"], key_mask, pb)
    outs = []
    for b in range(pb.shape[0]):
        km = None if key_mask is None else key_mask[b : b + 1]
        outs.append(fn(prob["q"][b : b + 1], prob["k"][b : b + 1], prob["v"][b : b + 1], km, pb[b]))
    return torch.cat(outs, dim=0)


def parallel(prob, key_mask=None):
    variant = prob["variant"]

    def fn(q, k, v, km, pb):
        if variant == "simple":
            return aft_simple(q, k, v, causal=True, key_mask=km)
        if variant == "local":
            return aft_local(q, k, v, pb, prob["window"], causal=True, key_mask=km)
        if variant == "conv1d":
            return aft_conv1d(q, k, v, prob["weight"], causal=True, key_mask=km)
        return aft_full(q, k, v, pb, causal=True, key_mask=km)

    return _per_batch(fn, prob, key_mask)


def reference(prob, key_mask=None):
    """float64 reference output (inputs upcast exactly)."""
    variant = prob["variant"]

    def fn(q, k, v, km, pb):
        q, k, v = q.double(), k.double(), v.double()
        pb = None if pb is None else pb.double()
        if variant == "simple":
            return aft_simple_reference(q, k, v, causal=True, key_mask=km)
        if variant == "local":
            return aft_local_reference(q, k, v, pb, prob["window"], causal=True, key_mask=km)
        if variant == "conv1d":
            return aft_conv1d_reference(q, k, v, prob["weight"].double(), causal=True, key_mask=km)
        return aft_full_reference(q, k, v, pb, causal=True, key_mask=km)

    return _per_batch(fn, prob, key_mask)


def assert_states_close(a, b, **tol):
    assert type(a) is type(b)
    assert a.step == b.step
    for name in a._TENSOR_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape, name
        if x.dtype == torch.bool:
            assert torch.equal(x, y), name
        else:
            torch.testing.assert_close(x, y, msg=name, **tol)


F32 = {"atol": 1e-5, "rtol": 1e-5}


# ----------------------------------------------------------------------------------------------------------------
# stepping equals the causal parallel operator and the float64 reference
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask_kind", [None, "left_pad", "holes"])
@pytest.mark.parametrize("T", [1, 5, 37])
@pytest.mark.parametrize(("variant", "param", "heads"), CONFIGS, ids=CONFIG_IDS)
def test_steps_match_parallel_and_reference(variant, param, heads, T, mask_kind):
    B = 3
    prob = make_problem(variant, param, heads, B, T, seed=T)
    mask = make_mask(mask_kind, B, T)
    y, state = run_steps(prob, mask)
    assert y.shape == (B, T, C) and y.dtype == torch.float32
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), reference(prob, mask), **F32)
    torch.testing.assert_close(y, parallel(prob, mask), **F32)
    assert state.step == T and state.batch_size == B


@pytest.mark.parametrize(("variant", "param"), [("local", 4), ("local", 40), ("full", None)])
def test_steps_with_batched_bias(variant, param):
    B, T = 3, 23
    prob = make_problem(variant, param, None, B, T, seed=5, batched_bias=True)
    mask = make_mask("holes", B, T)
    y, _ = run_steps(prob, mask)
    torch.testing.assert_close(y.double(), reference(prob, mask), **F32)
    torch.testing.assert_close(y, parallel(prob, mask), **F32)


@pytest.mark.parametrize(("variant", "param", "heads"), CONFIGS, ids=CONFIG_IDS)
def test_float64_inputs_are_exact(variant, param, heads):
    B, T = 2, 11
    prob = make_problem(variant, param, heads, B, T, seed=3, dtype=torch.float64)
    mask = make_mask("holes", B, T)
    y, state = run_steps(prob, mask)
    assert y.dtype == torch.float64 and state.dtype == torch.float64
    torch.testing.assert_close(y, reference(prob, mask), atol=1e-12, rtol=1e-12)


def test_local_step_bias_helper():
    T, window = 7, 4
    pb = torch.randn(2, T, T)
    for t in range(T):
        got = aft_local_step_bias(pb, t, window)
        want = torch.tensor([[pb[b, t, t - o].item() if t - o >= 0 else 0.0 for o in range(window)] for b in range(2)])
        torch.testing.assert_close(got, want, atol=0, rtol=0)
        torch.testing.assert_close(aft_local_step_bias(pb[1], t, window), want[1], atol=0, rtol=0)


def test_gradients_match_reference():
    B, T = 2, 6
    prob = make_problem("local", 3, None, B, T, seed=9, dtype=torch.float64)
    mask = make_mask("holes", B, T)
    for name in ("q", "k", "v", "pos_bias"):
        prob[name].requires_grad_(True)
    y, _ = run_steps(prob, mask)
    g_step = torch.autograd.grad(y.sin().sum(), [prob[n] for n in ("q", "k", "v", "pos_bias")])
    g_ref = torch.autograd.grad(reference(prob, mask).sin().sum(), [prob[n] for n in ("q", "k", "v", "pos_bias")])
    for a, b in zip(g_step, g_ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


# ----------------------------------------------------------------------------------------------------------------
# prefill, state size, beam search
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", [0, 1, 4, 12])
@pytest.mark.parametrize(("variant", "param", "heads"), CONFIGS, ids=CONFIG_IDS)
def test_prefill_then_step_equals_stepping_from_scratch(variant, param, heads, prompt):
    B, extra = 3, 6
    T = prompt + extra
    prob = make_problem(variant, param, heads, B, T, seed=prompt + 11)
    mask = make_mask("holes", B, T)
    y_scratch, state_scratch = run_steps(prob, mask, stop=prompt) if prompt else (None, None)
    state = prefill(prob, prompt, mask)
    assert state.step == prompt
    if prompt:
        assert_states_close(state, state_scratch, **F32)
    y_all, _ = run_steps(prob, mask)
    y_cont, state_cont = run_steps(prob, mask, state=state, start=prompt)
    torch.testing.assert_close(y_cont, y_all[:, prompt:], **F32)
    _, state_all = run_steps(prob, mask)
    assert_states_close(state_cont, state_all, **F32)


@pytest.mark.parametrize(("variant", "param", "heads"), [c for c in CONFIGS if c[0] != "full"], ids=CONFIG_IDS[:-1])
def test_state_size_is_constant(variant, param, heads):
    B, T = 2, 1024
    prob = make_problem(variant, param, heads, B, T, seed=2)
    _, s64 = run_steps(prob, stop=64)
    _, s1024 = run_steps(prob, state=s64, start=64)
    assert s64.step == 64 and s1024.step == 1024
    assert s64.nbytes() == s1024.nbytes() == prefill(prob, 64).nbytes() == prefill(prob, 1024).nbytes()
    r = {"simple": 0, "local": (param or 1) - 1, "conv1d": (param or 1) // 2}[variant]
    H = heads if variant == "conv1d" else C
    assert (s1024.num.shape, s1024.den.shape, s1024.run_max.shape) == ((B, H, C // H), (B, H), (B, H))
    assert (s1024.keys.shape, s1024.values.shape, s1024.key_mask.shape) == ((B, r, H), (B, r, H, C // H), (B, r))


def test_full_state_grows():
    B = 2
    prob = make_problem("full", None, None, B, 1024, seed=2)
    s64, s1024 = prefill(prob, 64), prefill(prob, 1024)
    assert s1024.nbytes() > s64.nbytes()
    _, s65 = run_steps(prob, state=s64, start=64, stop=65)
    assert s65.keys.shape == (B, 65, C) and s65.step == 65


@pytest.mark.parametrize(("variant", "param", "heads"), CONFIGS, ids=CONFIG_IDS)
def test_reorder_equals_stepping_the_reordered_batch(variant, param, heads):
    B, T1, T = 4, 7, 12
    prob = make_problem(variant, param, heads, B, T, seed=4)
    mask = make_mask("holes", B, T)
    _, state = run_steps(prob, mask, stop=T1)
    beam_idx = torch.tensor([2, 0, 0, 3])
    reordered = state.reorder(beam_idx)
    assert reordered is not state and state.batch_size == B
    y, _ = run_steps(prob, mask, state=reordered, start=T1)
    # the same: the prefix of each sequence replaced by the prefix of sequence beam_idx[i]
    other = dict(prob)
    for name in ("q", "k", "v"):
        other[name] = torch.cat([prob[name][beam_idx, :T1], prob[name][:, T1:]], dim=1)
    other_mask = torch.cat([mask[beam_idx, :T1], mask[:, T1:]], dim=1)
    y_want, _ = run_steps(other, other_mask)
    torch.testing.assert_close(y, y_want[:, T1:], **F32)
    # batch_repeat_interleave equals reorder with repeated indices
    assert_states_close(
        state.batch_repeat_interleave(3), state.reorder(torch.arange(B).repeat_interleave(3)), atol=0, rtol=0
    )


def test_state_to_and_detach():
    prob = make_problem("local", 3, None, 2, 9, seed=6)
    mask = make_mask("holes", 2, 9)
    y_all, _ = run_steps(prob, mask)
    _, state = run_steps(prob, mask, stop=5)
    s64 = state.to(torch.float64)
    assert s64.dtype == torch.float64 and s64.key_mask.dtype == torch.bool
    assert s64.nbytes() > state.nbytes()
    assert state.to("cpu").device == torch.device("cpu")
    assert state.to("cpu", torch.float64).dtype == torch.float64
    y, s_next = run_steps(prob, mask, state=s64, start=5)
    assert s_next.dtype == torch.float64  # a float64 state keeps computing in float64
    torch.testing.assert_close(y, y_all[:, 5:], **F32)
    assert_states_close(state.detach(), state, atol=0, rtol=0)
    with pytest.raises(TypeError):
        state.to(torch.int64)


# ----------------------------------------------------------------------------------------------------------------
# numerical stability
# ----------------------------------------------------------------------------------------------------------------


def extreme_problem(variant, param, heads, B, T, dtype, seed):
    """Keys rising from -1000 to 1000 and falling again (plus noise), biases up to |10|."""
    prob = make_problem(variant, param, heads, B, T, seed=seed, bias_scale=1.0)
    half = T // 2
    ramp = torch.cat([torch.linspace(-1000, 1000, half), torch.linspace(1000, -1000, T - half)])
    k = prob["k"].float()
    k = (ramp.view(1, T, 1) + 3 * k).clamp(-1000, 1000)
    k[1] = -k[1]  # the other way round: falling then rising
    prob["k"] = k.to(dtype)
    for name in ("q", "v"):
        prob[name] = prob[name].to(dtype)
    g = torch.Generator().manual_seed(seed + 100)
    for name in ("pos_bias", "weight"):
        if name in prob:
            prob[name] = (20 * torch.rand(prob[name].shape, generator=g) - 10).to(dtype)
    return prob


@pytest.mark.parametrize(
    ("dtype", "tol"),
    [(torch.float32, 2e-4), (torch.float16, 3e-3), (torch.bfloat16, 2e-2)],
    ids=["float32", "float16", "bfloat16"],
)
@pytest.mark.parametrize(("variant", "param", "heads"), CONFIGS, ids=CONFIG_IDS)
def test_extreme_keys_and_low_precision(variant, param, heads, dtype, tol):
    B, T = 3, 48
    prob = extreme_problem(variant, param, heads, B, T, dtype, seed=7)
    mask = make_mask("holes", B, T)
    y, state = run_steps(prob, mask)
    assert y.dtype == dtype and state.dtype == torch.float32
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), reference(prob, mask), atol=tol, rtol=tol)
    # the prefill path sees the same extremes
    y_cont, _ = run_steps(prob, mask, state=prefill(prob, T // 2 + 3, mask), start=T // 2 + 3)
    torch.testing.assert_close(y_cont.double(), reference(prob, mask)[:, T // 2 + 3 :], atol=tol, rtol=tol)


@pytest.mark.parametrize("variant", ["simple", "local", "conv1d"])
def test_keys_at_plus_minus_1000(variant):
    B, T = 2, 20
    heads = 2 if variant == "conv1d" else None
    prob = make_problem(variant, 5, heads, B, T, seed=8)
    sign = torch.where(torch.arange(T) % 3 == 0, 1.0, -1.0)
    prob["k"] = 1000.0 * sign.view(1, T, 1).expand_as(prob["k"]).clone()
    y, state = run_steps(prob)
    assert torch.isfinite(y).all()
    assert torch.isfinite(state.num).all() and torch.isfinite(state.den).all()
    # K + w rounds to float32 (spacing 6e-5 at 1000): a relative error of about 1e-4 in the weights
    torch.testing.assert_close(y.double(), reference(prob), atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------------------------------------------
# input validation
# ----------------------------------------------------------------------------------------------------------------


def test_bad_inputs_raise():
    B = 2
    q, k, v = torch.randn(3, B, C).unbind(0)
    kh = torch.randn(B, 2)
    w = torch.randn(2, 3)
    b3 = torch.randn(3)
    _, local_state = aft_local_step(q, k, v, b3, 3)
    _, simple_state = aft_simple_step(q, k, v)
    _, conv_state = aft_conv1d_step(q, kh, v, w)
    _, full_state = aft_full_step(q, k, v, torch.randn(1))

    value_errors = [
        lambda: aft_simple_step(q, k[:, :4], v),  # k channels
        lambda: aft_simple_step(q, k, v[:1]),  # batch
        lambda: aft_simple_step(q.unsqueeze(1), k, v),  # 3-D q
        lambda: aft_local_step(q, k, v, torch.randn(1), 0),  # window < 1
        lambda: aft_local_step(q, k, v, torch.randn(4), 3),  # bias length
        lambda: aft_local_step(q, k, v, torch.randn(3, 3), 3),  # bias batch
        lambda: aft_local_step(q, k, v, b3, 4, local_state),  # window differs from the state's
        lambda: aft_local_step(q, k, v, b3, 3, simple_state),  # another variant
        lambda: aft_local_step(q[:1], k[:1], v[:1], b3, 3, local_state),  # another batch size
        lambda: aft_simple_step(q, k, v, local_state),
        lambda: aft_simple_step(q, k, v, simple_state, key_mask_t=torch.ones(3, dtype=torch.bool)),
        lambda: aft_conv1d_step(q, kh, v, torch.randn(2, 4)),  # even kernel
        lambda: aft_conv1d_step(q, torch.randn(B, 4), v, torch.randn(4, 3)),  # C % h
        lambda: aft_conv1d_step(q, kh, v, torch.randn(3, 3)),  # heads differ
        lambda: aft_conv1d_step(q, kh, v, torch.randn(2, 5), conv_state),  # kernel differs from the state's
        lambda: aft_full_step(q, k, v, torch.randn(1), full_state),  # bias must be (t + 1,) = (2,)
        lambda: aft_full_step(q[:1], k[:1], v[:1], torch.randn(2), full_state),
        lambda: aft_local_prefill_state(torch.randn(B, 4, C), torch.randn(B, 4, C), 0),
        lambda: aft_local_prefill_state(torch.randn(B, 4, C), torch.randn(B, 5, C), 2),
        lambda: aft_simple_prefill_state(torch.randn(B, 4, C), torch.randn(B, 4, C), torch.ones(B, 3, dtype=bool)),
        lambda: aft_conv1d_prefill_state(torch.randn(B, 4, 3), torch.randn(B, 4, C), torch.randn(2, 3)),
        lambda: aft_local_step_bias(torch.randn(4, 4), 4, 2),
        lambda: local_state.reorder(torch.tensor([0, 2])),
        lambda: local_state.batch_repeat_interleave(0),
    ]
    for i, fn in enumerate(value_errors):
        with pytest.raises(ValueError):
            fn()
            pytest.fail(f"case {i} did not raise")

    type_errors = [
        lambda: aft_simple_step(q.numpy(), k, v),
        lambda: aft_simple_step(q, k.long(), v),
        lambda: aft_local_step(q, k, v, b3, 3.0),
        lambda: aft_simple_step(q, k, v, key_mask_t=torch.ones(B)),
        lambda: aft_local_step(q, k, v, b3, 3, full_state),
        lambda: aft_full_step(q, k, v, torch.randn(2), local_state),
        lambda: local_state.reorder([0, 1]),
    ]
    for fn in type_errors:
        with pytest.raises(TypeError):
            fn()


def test_error_messages_are_readable():
    q, k, v = torch.randn(3, 2, C).unbind(0)
    _, state = aft_local_step(q, k, v, torch.randn(3), 3)
    with pytest.raises(ValueError, match="window 3 but window 5"):
        aft_local_step(q, k, v, torch.randn(5), 5, state)
    with pytest.raises(ValueError, match="AFT-local, not AFT-simple"):
        aft_simple_step(q, k, v, state)
    with pytest.raises(ValueError, match="batch size 2 but the inputs have 1"):
        aft_local_step(q[:1], k[:1], v[:1], torch.randn(3), 3, state)
    assert isinstance(state, AFTDecodeState) and not isinstance(state, AFTFullDecodeState)
    assert math.isinf(float(aft_simple_prefill_state(torch.randn(1, 0, 2), torch.randn(1, 0, 2)).run_max[0, 0]))
