"""Causal AFT decoding: one token at a time with constant work and memory (AFT-simple, AFT-local, 1-D AFT-conv).

At step t (0-based) the causal operators of :mod:`aft_hub.ops.functional` give

    Y_t = sigmoid(Q_t) * sum_{t' <= t} exp(K_t' + w[t, t']) V_t' / sum_{t' <= t} exp(K_t' + w[t, t'])

For AFT-simple (w = 0), AFT-local (w[t, t'] = 0 once t - t' >= window) and causal 1-D AFT-conv (w = 0 once
t - t' > s // 2) every key more than r positions back has bias 0, with r = 0, window - 1 and s // 2. The decoding
state (:class:`AFTDecodeState`) therefore holds

* the running numerator sum exp(K_t' - m) V_t', denominator sum exp(K_t' - m) and maximum m of the keys that have
  left the window (the RWKV-style running maximum: the sums are always relative to m, so they never overflow and
  keys that rise by thousands over time are handled exactly);
* the last r keys, values and key-mask entries, oldest first, for the window term with its per-offset biases.

Its size does not depend on the number of tokens seen. AFT-full with a position-dependent bias needs every past key
and value: :class:`AFTFullDecodeState` keeps them (it grows by one key per step).

Each step shifts all exponents by M = max(m, max over the visible window of K + w), so every exponential is at most
1 and the largest is exactly 1: the result is finite for any finite input. Computation is in float32 (float64 when
an input or the state is float64); outputs have the dtype of q and the state is kept in the computation dtype.

A prompt of T tokens is absorbed in one parallel pass by the ``*_prefill_state`` functions (O(T) work); stepping on
from a prefilled state gives the same result as stepping through the prompt. Keys whose key-mask entry is False (for
example left padding) take no part but still advance the position. Rows that see no key produce 0, like the parallel
operators.

Typical use in a causal LM::

    y = aft_local(q, k, v, pos_bias, window, causal=True, key_mask=mask)  # the prompt, in parallel
    state = aft_local_prefill_state(k, v, window, key_mask=mask)
    for each new token (position t = state.step):
        bias_t = aft_local_step_bias(pos_bias, t, window)
        y_t, state = aft_local_step(q_t, k_t, v_t, bias_t, window, state)
    # beam search: state = state.reorder(beam_idx)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

__all__ = [
    "AFTDecodeState",
    "AFTFullDecodeState",
    "aft_simple_step",
    "aft_local_step",
    "aft_conv1d_step",
    "aft_full_step",
    "aft_simple_prefill_state",
    "aft_local_prefill_state",
    "aft_conv1d_prefill_state",
    "aft_full_prefill_state",
    "aft_local_step_bias",
]

_WINDOWED_VARIANTS = ("simple", "local", "conv1d")


# ----------------------------------------------------------------------------------------------------------------
# states
# ----------------------------------------------------------------------------------------------------------------


class _StateMixin:
    """Batch-wise operations shared by the decoding states (they hold tensors whose dim 0 is the batch)."""

    _TENSOR_FIELDS: ClassVar[tuple[str, ...]] = ()

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self._TENSOR_FIELDS}

    @property
    def batch_size(self) -> int:
        """Number of sequences B."""
        return int(getattr(self, self._TENSOR_FIELDS[0]).shape[0])

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the running sums and buffers."""
        return getattr(self, self._TENSOR_FIELDS[0]).dtype

    @property
    def device(self) -> torch.device:
        """Device of the state's tensors."""
        return getattr(self, self._TENSOR_FIELDS[0]).device

    def nbytes(self) -> int:
        """Total bytes of the state's tensors."""
        return sum(t.numel() * t.element_size() for t in self._tensors().values())

    def reorder(self, beam_idx: torch.Tensor):
        """Select batch entries, as beam search does after each step; returns a new state (self is unchanged).

        Args:
            beam_idx: (B',) integer tensor of indices into the batch (repeats allowed; range-checked on CPU).

        Returns:
            A state of batch size B' whose entry i is entry beam_idx[i] of this one.
        """
        if not isinstance(beam_idx, torch.Tensor):
            raise TypeError(f"beam_idx must be a torch.Tensor of indices, got {type(beam_idx).__name__}.")
        if beam_idx.dim() != 1 or beam_idx.is_floating_point() or beam_idx.dtype == torch.bool:
            raise ValueError(
                f"beam_idx must be a 1-D integer tensor, got shape {tuple(beam_idx.shape)} and dtype {beam_idx.dtype}."
            )
        idx = beam_idx.to(device=self.device, dtype=torch.long)
        # range check on CPU only: on an accelerator it would synchronise the device at every beam-search step
        if idx.device.type == "cpu" and idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.batch_size):
            raise ValueError(f"beam_idx holds indices outside [0, {self.batch_size}).")
        return dataclasses.replace(self, **{n: t.index_select(0, idx) for n, t in self._tensors().items()})

    def batch_repeat_interleave(self, repeats: int):
        """Repeat every batch entry ``repeats`` times in place order (b0, b0, ..., b1, b1, ...), e.g. to expand a
        prefilled prompt into beams; returns a new state.

        Args:
            repeats: int >= 1.
        """
        if isinstance(repeats, bool) or not isinstance(repeats, int):
            raise TypeError(f"repeats must be an int, got {type(repeats).__name__}.")
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}.")
        return dataclasses.replace(
            self, **{n: t.repeat_interleave(repeats, dim=0) for n, t in self._tensors().items()}
        )

    def to(self, device: torch.device | str | torch.dtype | None = None, dtype: torch.dtype | None = None):
        """Move the state to a device and/or cast its floating tensors (the key masks stay bool); returns a new state.

        ``state.to(torch.float64)`` and ``state.to("cuda")`` both work. Note that the next step computes in float32
        (or float64) and returns its state in that dtype, whatever the dtype given here.

        Args:
            device: target device (or a dtype, as with ``Tensor.to``).
            dtype: target floating dtype.
        """
        if isinstance(device, torch.dtype):
            if dtype is not None:
                raise TypeError("Give the dtype once.")
            device, dtype = None, device
        if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype}.")
        out = {}
        for name, t in self._tensors().items():
            out[name] = t.to(device=device, dtype=dtype if t.is_floating_point() else None)
        return dataclasses.replace(self, **out)

    def detach(self):
        """The state with every tensor detached from the autograd graph (e.g. between truncated-BPTT chunks)."""
        return dataclasses.replace(self, **{n: t.detach() for n, t in self._tensors().items()})


@dataclass
class AFTDecodeState(_StateMixin):
    """Constant-size causal decoding state of AFT-simple, AFT-local and 1-D AFT-conv.

    Keys have H channels with D = C // H query/value channels each: H = C, D = 1 for AFT-simple and AFT-local;
    H = h heads for AFT-conv. The buffer holds the r most recent keys (r = 0 for AFT-simple, window - 1 for
    AFT-local, s // 2 for AFT-conv), oldest first; older keys are folded into the running sums with bias 0.

    Attributes:
        variant: "simple", "local" or "conv1d".
        num: (B, H, D) sum over the keys that left the window of exp(K - run_max) * V.
        den: (B, H) sum over the keys that left the window of exp(K - run_max).
        run_max: (B, H) maximum of the keys that left the window (-inf while there is none); detached.
        keys: (B, r, H) the last r keys, oldest first (keys[:, -1] is the latest); masked entries hold 0.
        values: (B, r, H, D) their values; masked entries hold 0.
        key_mask: (B, r) bool, False where the key takes no part (padding, or positions before the sequence start).
        step: number of tokens seen so far, i.e. the position of the next token.
    """

    _TENSOR_FIELDS: ClassVar[tuple[str, ...]] = ("num", "den", "run_max", "keys", "values", "key_mask")

    variant: str
    num: torch.Tensor
    den: torch.Tensor
    run_max: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    key_mask: torch.Tensor
    step: int

    def __post_init__(self) -> None:
        if self.variant not in _WINDOWED_VARIANTS:
            raise ValueError(f"variant must be one of {_WINDOWED_VARIANTS}, got {self.variant!r}.")
        if self.num.dim() != 3:
            raise ValueError(f"num must be (B, H, D), got shape {tuple(self.num.shape)}.")
        B, H, D = self.num.shape
        r = self.keys.shape[1] if self.keys.dim() == 3 else -1
        expected = {
            "den": (B, H),
            "run_max": (B, H),
            "keys": (B, r, H),
            "values": (B, r, H, D),
            "key_mask": (B, r),
        }
        for name, shape in expected.items():
            if tuple(getattr(self, name).shape) != shape or r < 0:
                raise ValueError(
                    f"Inconsistent AFTDecodeState: {name} has shape {tuple(getattr(self, name).shape)}, "
                    f"expected {shape} from num {tuple(self.num.shape)} and keys {tuple(self.keys.shape)}."
                )
        if self.key_mask.dtype != torch.bool:
            raise TypeError(f"key_mask must be bool, got {self.key_mask.dtype}.")
        if self.variant == "simple" and r != 0:
            raise ValueError(f"An AFT-simple state has no key buffer, got one of {r} keys.")
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise ValueError(f"step must be an int >= 0, got {self.step!r}.")

    @property
    def num_heads(self) -> int:
        """Number of key channels H."""
        return int(self.num.shape[1])

    @property
    def head_dim(self) -> int:
        """Query/value channels per key channel, D."""
        return int(self.num.shape[2])

    @property
    def buffer_size(self) -> int:
        """Number r of recent keys kept for the window term."""
        return int(self.keys.shape[1])


@dataclass
class AFTFullDecodeState(_StateMixin):
    """Causal decoding state of AFT-full: every past key and value (it grows by one per step).

    Attributes:
        keys: (B, n, C) all past keys, masked entries hold 0.
        values: (B, n, C) all past values, masked entries hold 0.
        key_mask: (B, n) bool, False where the key takes no part.
        step: number of tokens seen so far (= n), i.e. the position of the next token.
    """

    _TENSOR_FIELDS: ClassVar[tuple[str, ...]] = ("keys", "values", "key_mask")

    keys: torch.Tensor
    values: torch.Tensor
    key_mask: torch.Tensor
    step: int

    def __post_init__(self) -> None:
        if self.keys.dim() != 3:
            raise ValueError(f"keys must be (B, n, C), got shape {tuple(self.keys.shape)}.")
        B, n, C = self.keys.shape
        if tuple(self.values.shape) != (B, n, C):
            raise ValueError(f"values must have the shape of keys {(B, n, C)}, got {tuple(self.values.shape)}.")
        if tuple(self.key_mask.shape) != (B, n) or self.key_mask.dtype != torch.bool:
            raise ValueError(
                f"key_mask must be bool of shape {(B, n)}, got {tuple(self.key_mask.shape)} {self.key_mask.dtype}."
            )
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step != n:
            raise ValueError(f"step must equal the number of stored keys {n}, got {self.step!r}.")


# ----------------------------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------------------------


def _check_tensor(name: str, x, ndim: int | tuple[int, ...]) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}.")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}.")
    dims = (ndim,) if isinstance(ndim, int) else ndim
    if x.dim() not in dims:
        want = " or ".join(str(d) for d in dims)
        raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(x.shape)}.")


def _check_int(name: str, x, minimum: int) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}.")
    if x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}.")
    return x


def _check_step_qkv(q_t, k_t, v_t, key_channels: int | None = None) -> tuple[int, int, int]:
    """Validate one token's q, k, v; returns (B, C, H)."""
    for name, x in (("q_t", q_t), ("k_t", k_t), ("v_t", v_t)):
        _check_tensor(name, x, 2)
    B, C = q_t.shape
    if tuple(v_t.shape) != (B, C):
        raise ValueError(f"v_t must have the shape of q_t {(B, C)}, got {tuple(v_t.shape)}.")
    H = C if key_channels is None else key_channels
    if tuple(k_t.shape) != (B, H):
        raise ValueError(f"k_t must have shape (batch, key channels) = {(B, H)}, got {tuple(k_t.shape)}.")
    if C == 0 or H == 0:
        raise ValueError("q_t, k_t and v_t must have at least one channel.")
    return B, C, H


def _check_prefill_kv(k, v, key_mask, key_channels: int | None = None) -> tuple[int, int, int, int]:
    """Validate a prompt's k, v and key mask; returns (B, T, C, H)."""
    _check_tensor("k", k, 3)
    _check_tensor("v", v, 3)
    B, T, C = v.shape
    H = C if key_channels is None else key_channels
    if tuple(k.shape) != (B, T, H):
        raise ValueError(f"k must have shape (batch, seq_len, key channels) = {(B, T, H)}, got {tuple(k.shape)}.")
    if C == 0 or H == 0:
        raise ValueError("k and v must have at least one channel.")
    if key_mask is not None:
        if not isinstance(key_mask, torch.Tensor):
            raise TypeError(f"key_mask must be a torch.Tensor of bools, got {type(key_mask).__name__}.")
        if key_mask.dtype != torch.bool:
            raise TypeError(f"key_mask must have dtype torch.bool (True = key takes part), got {key_mask.dtype}.")
        if tuple(key_mask.shape) != (B, T):
            raise ValueError(f"key_mask must have shape (batch, seq_len) = {(B, T)}, got {tuple(key_mask.shape)}.")
    return B, T, C, H


def _check_key_mask_t(key_mask_t, B: int) -> None:
    if key_mask_t is None:
        return
    if not isinstance(key_mask_t, torch.Tensor):
        raise TypeError(f"key_mask_t must be a torch.Tensor of bools, got {type(key_mask_t).__name__}.")
    if key_mask_t.dtype != torch.bool:
        raise TypeError(f"key_mask_t must have dtype torch.bool (True = key takes part), got {key_mask_t.dtype}.")
    if tuple(key_mask_t.shape) != (B,):
        raise ValueError(f"key_mask_t must have shape (batch,) = {(B,)}, got {tuple(key_mask_t.shape)}.")


def _check_heads(C: int, H: int) -> int:
    if C % H:
        raise ValueError(f"The channel count {C} must be divisible by the number of heads {H}.")
    return C // H


def _check_conv_weight(weight) -> tuple[int, int]:
    _check_tensor("weight", weight, 2)
    h, s = weight.shape
    if h == 0:
        raise ValueError("weight must have at least one head.")
    if s % 2 == 0:
        raise ValueError(f"The kernel size (weight.shape[1]) must be odd, got {s}.")
    return h, s


def _compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _check_windowed_state(state, variant: str, B: int, H: int, D: int, r: int, device: torch.device) -> None:
    if not isinstance(state, AFTDecodeState):
        kind = "an AFT-full state" if isinstance(state, AFTFullDecodeState) else type(state).__name__
        raise TypeError(f"state must be an AFTDecodeState made by the {variant} functions, got {kind}.")
    if state.variant != variant:
        raise ValueError(f"state was made for AFT-{state.variant}, not AFT-{variant}.")
    if state.batch_size != B:
        raise ValueError(
            f"state has batch size {state.batch_size} but the inputs have {B} (use state.reorder or "
            "state.batch_repeat_interleave to change it)."
        )
    if (state.num_heads, state.head_dim) != (H, D):
        raise ValueError(
            f"state has {state.num_heads} key channels of {state.head_dim} value channels each, "
            f"but the inputs have {H} of {D}."
        )
    if state.buffer_size != r:
        what = {"local": f"window {r + 1}", "conv1d": f"kernel size {2 * r + 1}", "simple": "no window"}[variant]
        have = {"local": f"window {state.buffer_size + 1}", "conv1d": f"kernel size {2 * state.buffer_size + 1}"}
        raise ValueError(f"state was made for {have.get(variant, 'a window')} but {what} was given.")
    if state.device != device:
        raise ValueError(f"state is on {state.device} but the inputs are on {device}.")


# ----------------------------------------------------------------------------------------------------------------
# AFT-simple / AFT-local / AFT-conv: running sums for old keys plus a buffer of the last r keys
# ----------------------------------------------------------------------------------------------------------------


def _empty_windowed_state(
    variant: str, B: int, H: int, D: int, r: int, dtype: torch.dtype, device: torch.device
) -> AFTDecodeState:
    return AFTDecodeState(
        variant=variant,
        num=torch.zeros(B, H, D, dtype=dtype, device=device),
        den=torch.zeros(B, H, dtype=dtype, device=device),
        run_max=torch.full((B, H), float("-inf"), dtype=dtype, device=device),
        keys=torch.zeros(B, r, H, dtype=dtype, device=device),
        values=torch.zeros(B, r, H, D, dtype=dtype, device=device),
        key_mask=torch.zeros(B, r, dtype=torch.bool, device=device),
        step=0,
    )


def _finite_or_zero(m: torch.Tensor) -> torch.Tensor:
    """m where finite, else 0 (a shift for rows that see no key: all their weights are exp(-inf) = 0)."""
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def _windowed_step(
    variant: str,
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    band: torch.Tensor | None,
    r: int,
    state: AFTDecodeState | None,
    key_mask_t: torch.Tensor | None,
    H: int,
) -> tuple[torch.Tensor, AFTDecodeState]:
    """One step of the windowed variants.

    Args:
        q_t, v_t: (B, C); k_t: (B, H).
        band: (1 or B, r + 1, 1 or H) bias of [the r buffered keys, oldest first, then the current key], or None
            for bias 0 everywhere (AFT-simple).
        r: buffer size.
    """
    B, C = q_t.shape
    D = C // H
    device = q_t.device
    if state is not None:
        _check_windowed_state(state, variant, B, H, D, r, device)
    dtype = _compute_dtype(q_t, k_t, v_t, band, None if state is None else state.num)
    if state is None:
        state = _empty_windowed_state(variant, B, H, D, r, dtype, device)
    cur_mask = torch.ones(B, dtype=torch.bool, device=device) if key_mask_t is None else key_mask_t.to(device)
    kf = torch.where(cur_mask[:, None], k_t.to(dtype), torch.zeros((), dtype=dtype, device=device))
    vf = torch.where(cur_mask[:, None], v_t.to(dtype), torch.zeros((), dtype=dtype, device=device))

    keys = torch.cat([state.keys.to(dtype), kf.unsqueeze(1)], dim=1)  # (B, r + 1, H)
    values = torch.cat([state.values.to(dtype), vf.view(B, 1, H, D)], dim=1)  # (B, r + 1, H, D)
    mask = torch.cat([state.key_mask, cur_mask.unsqueeze(1)], dim=1)  # (B, r + 1)
    num_o, den_o, m_o = state.num.to(dtype), state.den.to(dtype), state.run_max.to(dtype)

    # output: the window keys with their biases plus the old keys (bias 0), all shifted by M
    logits = keys if band is None else keys + band.to(device=device, dtype=dtype)
    logits = torch.where(mask.unsqueeze(-1), logits, torch.full((), float("-inf"), dtype=dtype, device=device))
    shift = _finite_or_zero(torch.maximum(m_o, logits.amax(dim=1)).detach())  # (B, H)
    w = torch.exp(logits - shift.unsqueeze(1))  # (B, r + 1, H), <= 1
    scale_o = torch.exp(m_o - shift)  # (B, H), <= 1 (0 while there are no old keys)
    den = den_o * scale_o + w.sum(dim=1)
    num = num_o * scale_o.unsqueeze(-1) + (w.unsqueeze(-1) * values).sum(dim=1)
    tiny = torch.finfo(dtype).tiny
    y = (num / den.clamp_min(tiny).unsqueeze(-1)).reshape(B, C)
    y_t = (torch.sigmoid(q_t.to(dtype)) * y).to(q_t.dtype)

    # state update: the oldest buffered key (or the current one when r = 0) leaves the window, bias 0 from now on
    ev_mask = mask[:, 0].unsqueeze(-1)  # (B, 1)
    ev_k = keys[:, 0]  # (B, H)
    new_m = torch.where(ev_mask, torch.maximum(m_o, ev_k.detach()), m_o)
    safe_m = _finite_or_zero(new_m)
    decay = torch.exp(m_o - safe_m)  # <= 1, 0 while there were no old keys
    ev_w = torch.where(ev_mask, torch.exp(ev_k - safe_m), torch.zeros((), dtype=dtype, device=device))
    new_state = AFTDecodeState(
        variant=variant,
        num=num_o * decay.unsqueeze(-1) + ev_w.unsqueeze(-1) * values[:, 0],
        den=den_o * decay + ev_w,
        run_max=new_m,
        keys=keys[:, 1:],
        values=values[:, 1:],
        key_mask=mask[:, 1:],
        step=state.step + 1,
    )
    return y_t, new_state


def _windowed_prefill(
    variant: str, k: torch.Tensor, v: torch.Tensor, r: int, key_mask: torch.Tensor | None, H: int
) -> AFTDecodeState:
    """The state after a prompt: keys at positions < T - r summed with bias 0, the last r keys buffered."""
    B, T, C = v.shape
    D = C // H
    device = v.device
    dtype = _compute_dtype(k, v)
    if T == 0:
        return _empty_windowed_state(variant, B, H, D, r, dtype, device)
    mask = torch.ones(B, T, dtype=torch.bool, device=device) if key_mask is None else key_mask.to(device)
    zero = torch.zeros((), dtype=dtype, device=device)
    kf = torch.where(mask.unsqueeze(-1), k.to(dtype), zero)  # (B, T, H)
    vf = torch.where(mask.unsqueeze(-1), v.to(dtype), zero).view(B, T, H, D)
    n_out = max(T - r, 0)

    if n_out > 0:
        neg_inf = torch.full((), float("-inf"), dtype=dtype, device=device)
        k_out = torch.where(mask[:, :n_out].unsqueeze(-1), kf[:, :n_out], neg_inf)
        m_o = k_out.detach().amax(dim=1)  # (B, H), -inf where no valid old key
        w = torch.exp(k_out - _finite_or_zero(m_o).unsqueeze(1))  # (B, n_out, H), <= 1, 0 where masked
        den = w.sum(dim=1)
        num = (w.unsqueeze(-1) * vf[:, :n_out]).sum(dim=1)
    else:
        m_o = torch.full((B, H), float("-inf"), dtype=dtype, device=device)
        den = torch.zeros(B, H, dtype=dtype, device=device)
        num = torch.zeros(B, H, D, dtype=dtype, device=device)

    keys, values, buf_mask = kf[:, n_out:], vf[:, n_out:], mask[:, n_out:]
    pad = r - keys.shape[1]  # positions before the sequence start
    if pad > 0:
        keys = torch.cat([keys.new_zeros(B, pad, H), keys], dim=1)
        values = torch.cat([values.new_zeros(B, pad, H, D), values], dim=1)
        buf_mask = torch.cat([buf_mask.new_zeros(B, pad), buf_mask], dim=1)
    return AFTDecodeState(
        variant=variant, num=num, den=den, run_max=m_o, keys=keys, values=values, key_mask=buf_mask, step=T
    )


def aft_simple_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    state: AFTDecodeState | None = None,
    *,
    key_mask_t: torch.Tensor | None = None,
) -> tuple[torch.Tensor, AFTDecodeState]:
    """One causal AFT-simple step: Y_t = sigmoid(Q_t) * sum_{t' <= t} softmax_t'(K)_t' V_t' per channel.

    Args:
        q_t, k_t, v_t: (B, C) the current token.
        state: the state after the previous tokens, or None at the start of the sequence.
        key_mask_t: (B,) bool, False where the current key takes no part (e.g. left padding).

    Returns:
        y_t (B, C) in the dtype of q_t, and the new state (O(B * C) memory, whatever the length).
    """
    B, C, H = _check_step_qkv(q_t, k_t, v_t)
    _check_key_mask_t(key_mask_t, B)
    return _windowed_step("simple", q_t, k_t, v_t, None, 0, state, key_mask_t, H)


def aft_local_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    bias_t: torch.Tensor,
    window: int,
    state: AFTDecodeState | None = None,
    *,
    key_mask_t: torch.Tensor | None = None,
) -> tuple[torch.Tensor, AFTDecodeState]:
    """One causal AFT-local step at position t = state.step (0 without a state).

    The key at t' <= t has bias pos_bias[t, t'] when t - t' < window and 0 further back, as in
    ``aft_local(..., causal=True)``.

    Args:
        q_t, k_t, v_t: (B, C) the current token.
        bias_t: (window,) or (B, window); bias_t[..., o] = pos_bias[t, t - o] is the bias of the key o positions
            back. Entries with t - o < 0 are ignored (see :func:`aft_local_step_bias`).
        window: s >= 1, the window of the layer (the same at every step).
        state: the state after the previous tokens, or None at the start of the sequence.
        key_mask_t: (B,) bool, False where the current key takes no part (e.g. left padding).

    Returns:
        y_t (B, C) in the dtype of q_t, and the new state (O(B * window * C) memory, whatever the length).
    """
    window = _check_int("window", window, 1)
    B, C, H = _check_step_qkv(q_t, k_t, v_t)
    _check_key_mask_t(key_mask_t, B)
    _check_tensor("bias_t", bias_t, (1, 2))
    if tuple(bias_t.shape) not in ((window,), (B, window)):
        raise ValueError(
            f"bias_t must have shape (window,) = {(window,)} or (batch, window) = {(B, window)}, "
            f"got {tuple(bias_t.shape)}."
        )
    band = bias_t.reshape(-1, window).flip(-1).unsqueeze(-1)  # (1 or B, window, 1): oldest offset first
    return _windowed_step("local", q_t, k_t, v_t, band, window - 1, state, key_mask_t, H)


def aft_conv1d_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    weight: torch.Tensor,
    state: AFTDecodeState | None = None,
    *,
    key_mask_t: torch.Tensor | None = None,
) -> tuple[torch.Tensor, AFTDecodeState]:
    """One causal 1-D AFT-conv step, as ``aft_conv1d(..., causal=True)``.

    Head i has one key channel and D = C // h query/value channels; the key o <= 0 positions from the current one
    has bias weight[i, o + s // 2] when o >= -(s // 2) and 0 further back.

    Args:
        q_t, v_t: (B, C); k_t: (B, h) the current token, C divisible by h.
        weight: (h, s), s odd (the kernel of ``aft_conv1d``; only its causal half weight[:, :s // 2 + 1] is used).
        state: the state after the previous tokens, or None at the start of the sequence.
        key_mask_t: (B,) bool, False where the current key takes no part (e.g. left padding).

    Returns:
        y_t (B, C) in the dtype of q_t, and the new state (O(B * s * C) memory, whatever the length).
    """
    h, s = _check_conv_weight(weight)
    B, C, H = _check_step_qkv(q_t, k_t, v_t, key_channels=k_t.shape[-1] if k_t.dim() == 2 else None)
    if H != h:
        raise ValueError(f"k_t has {H} head channels but weight has {h} heads.")
    _check_heads(C, h)
    _check_key_mask_t(key_mask_t, B)
    r = s // 2
    band = weight[:, : r + 1].t().unsqueeze(0)  # (1, r + 1, h): entry j is the offset j - r
    return _windowed_step("conv1d", q_t, k_t, v_t, band, r, state, key_mask_t, h)


def aft_simple_prefill_state(k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None = None) -> AFTDecodeState:
    """The AFT-simple decoding state after a prompt, in one parallel pass (O(T * C)).

    Args:
        k, v: (B, T, C) the prompt's keys and values (T = 0 gives the empty state).
        key_mask: (B, T) bool, False for keys that take no part.

    Returns:
        The state that stepping through the prompt with :func:`aft_simple_step` would give.
    """
    _, _, _, H = _check_prefill_kv(k, v, key_mask)
    return _windowed_prefill("simple", k, v, 0, key_mask, H)


def aft_local_prefill_state(
    k: torch.Tensor, v: torch.Tensor, window: int, key_mask: torch.Tensor | None = None
) -> AFTDecodeState:
    """The AFT-local decoding state after a prompt, in one parallel pass (O(T * C)); no bias is needed.

    Args:
        k, v: (B, T, C) the prompt's keys and values (T = 0 gives the empty state).
        window: s >= 1.
        key_mask: (B, T) bool, False for keys that take no part.

    Returns:
        The state that stepping through the prompt with :func:`aft_local_step` would give.
    """
    window = _check_int("window", window, 1)
    _, _, _, H = _check_prefill_kv(k, v, key_mask)
    return _windowed_prefill("local", k, v, window - 1, key_mask, H)


def aft_conv1d_prefill_state(
    k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor, key_mask: torch.Tensor | None = None
) -> AFTDecodeState:
    """The 1-D AFT-conv decoding state after a prompt, in one parallel pass (O(T * C)).

    Args:
        k: (B, T, h); v: (B, T, C) the prompt's keys and values, C divisible by h (T = 0 gives the empty state).
        weight: (h, s), s odd (only its shape is used).
        key_mask: (B, T) bool, False for keys that take no part.

    Returns:
        The state that stepping through the prompt with :func:`aft_conv1d_step` would give.
    """
    h, s = _check_conv_weight(weight)
    _check_tensor("k", k, 3)
    _, _, C, H = _check_prefill_kv(k, v, key_mask, key_channels=k.shape[-1])
    if H != h:
        raise ValueError(f"k has {H} head channels but weight has {h} heads.")
    _check_heads(C, h)
    return _windowed_prefill("conv1d", k, v, s // 2, key_mask, h)


def aft_local_step_bias(pos_bias: torch.Tensor, t: int, window: int) -> torch.Tensor:
    """The ``bias_t`` argument of :func:`aft_local_step` at position t, gathered from a full bias matrix.

    Args:
        pos_bias: (T, T) or (B, T, T) with T > t, pos_bias[..., t, t'] the bias of key t' for query t.
        t: the position of the current token (state.step).
        window: s >= 1.

    Returns:
        (window,) or (B, window): out[..., o] = pos_bias[..., t, t - o], 0 where t - o < 0.
    """
    _check_tensor("pos_bias", pos_bias, (2, 3))
    t = _check_int("t", t, 0)
    window = _check_int("window", window, 1)
    if pos_bias.shape[-2] <= t or pos_bias.shape[-1] <= t:
        raise ValueError(f"pos_bias {tuple(pos_bias.shape)} has no row and column {t}.")
    cols = t - torch.arange(window, device=pos_bias.device)
    row = pos_bias[..., t, :].index_select(-1, cols.clamp_min(0))
    return torch.where(cols >= 0, row, torch.zeros((), dtype=row.dtype, device=row.device))


# ----------------------------------------------------------------------------------------------------------------
# AFT-full: every past key and value
# ----------------------------------------------------------------------------------------------------------------


def aft_full_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    bias_t: torch.Tensor,
    state: AFTFullDecodeState | None = None,
    *,
    key_mask_t: torch.Tensor | None = None,
) -> tuple[torch.Tensor, AFTFullDecodeState]:
    """One causal AFT-full step at position t = state.step (0 without a state), as ``aft_full(..., causal=True)``.

    O(t * C) work; the state grows by one key and value per step.

    Args:
        q_t, k_t, v_t: (B, C) the current token.
        bias_t: (t + 1,) or (B, t + 1), pos_bias[t, :t + 1] (the bias of keys 0 .. t for query t).
        state: the state after the previous tokens, or None at the start of the sequence.
        key_mask_t: (B,) bool, False where the current key takes no part (e.g. left padding).

    Returns:
        y_t (B, C) in the dtype of q_t, and the new state.
    """
    B, C, _ = _check_step_qkv(q_t, k_t, v_t)
    _check_key_mask_t(key_mask_t, B)
    device = q_t.device
    if state is not None:
        if not isinstance(state, AFTFullDecodeState):
            raise TypeError(f"state must be an AFTFullDecodeState, got {type(state).__name__}.")
        if state.batch_size != B:
            raise ValueError(
                f"state has batch size {state.batch_size} but the inputs have {B} (use state.reorder or "
                "state.batch_repeat_interleave to change it)."
            )
        if state.keys.shape[-1] != C:
            raise ValueError(f"state has {state.keys.shape[-1]} channels but the inputs have {C}.")
        if state.device != device:
            raise ValueError(f"state is on {state.device} but the inputs are on {device}.")
    t = 0 if state is None else state.step
    _check_tensor("bias_t", bias_t, (1, 2))
    if tuple(bias_t.shape) not in ((t + 1,), (B, t + 1)):
        raise ValueError(
            f"bias_t at position t = {t} must have shape (t + 1,) = {(t + 1,)} or (batch, t + 1) = {(B, t + 1)}, "
            f"got {tuple(bias_t.shape)}."
        )
    dtype = _compute_dtype(q_t, k_t, v_t, bias_t, None if state is None else state.keys)
    zero = torch.zeros((), dtype=dtype, device=device)
    cur_mask = torch.ones(B, dtype=torch.bool, device=device) if key_mask_t is None else key_mask_t.to(device)
    kf = torch.where(cur_mask[:, None], k_t.to(dtype), zero)
    vf = torch.where(cur_mask[:, None], v_t.to(dtype), zero)
    if state is None:
        keys, values, mask = kf.unsqueeze(1), vf.unsqueeze(1), cur_mask.unsqueeze(1)
    else:
        keys = torch.cat([state.keys.to(dtype), kf.unsqueeze(1)], dim=1)  # (B, t + 1, C)
        values = torch.cat([state.values.to(dtype), vf.unsqueeze(1)], dim=1)
        mask = torch.cat([state.key_mask, cur_mask.unsqueeze(1)], dim=1)  # (B, t + 1)

    logits = keys + bias_t.to(device=device, dtype=dtype).reshape(-1, t + 1, 1)
    logits = torch.where(mask.unsqueeze(-1), logits, torch.full((), float("-inf"), dtype=dtype, device=device))
    shift = _finite_or_zero(logits.detach().amax(dim=1, keepdim=True))  # (B, 1, C)
    w = torch.exp(logits - shift)  # <= 1, 0 where masked
    num = (w * values).sum(dim=1)
    den = w.sum(dim=1)
    y = num / den.clamp_min(torch.finfo(dtype).tiny)
    y_t = (torch.sigmoid(q_t.to(dtype)) * y).to(q_t.dtype)
    return y_t, AFTFullDecodeState(keys=keys, values=values, key_mask=mask, step=t + 1)


def aft_full_prefill_state(
    k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None = None
) -> AFTFullDecodeState:
    """The AFT-full decoding state after a prompt (the prompt's keys, values and mask; O(T * C)).

    Args:
        k, v: (B, T, C) the prompt's keys and values (T = 0 gives the empty state).
        key_mask: (B, T) bool, False for keys that take no part.

    Returns:
        The state that stepping through the prompt with :func:`aft_full_step` would give.
    """
    B, T, C, _ = _check_prefill_kv(k, v, key_mask)
    dtype = _compute_dtype(k, v)
    device = v.device
    mask = torch.ones(B, T, dtype=torch.bool, device=device) if key_mask is None else key_mask.to(device)
    zero = torch.zeros((), dtype=dtype, device=device)
    keys = torch.where(mask.unsqueeze(-1), k.to(dtype), zero)
    values = torch.where(mask.unsqueeze(-1), v.to(dtype), zero)
    return AFTFullDecodeState(keys=keys, values=values, key_mask=mask, step=T)
