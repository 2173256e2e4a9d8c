"""Blocked engine for AFT with per-channel keys and a banded position bias (AFT-local, causal AFT-simple).

The sequence is cut into blocks of L rows. Row block I sees its own key block and the P key blocks on each side
(only the P before it when causal) through small dense (L x L) bias-factor matrices, so the band and the keys near
it are a few batched matrix products; every key block further away has bias 0 for all rows of I and enters through
one "carry" vector per block, a prefix (and suffix) sum over per-block totals. Work: O(T * (2P + 1) * L * C) in
matrix products plus a few elementwise passes. Memory: O(T * C); the pieces are contiguous views of one zero-padded
key buffer, never window copies. Batch rows and channel ranges are processed in chunks of about 2^18 elements.

Bias factors: F = exp(w - wmax_t) <= 1 in the band, exp(-wmax_t) for the other visible keys and 0 for invisible ones,
with wmax_t = max(0, max of row t's band bias); the same exp(-wmax_t) weights the carry. The shift of a row cancels
in N / D, so rows are never rescaled.

Key shifts. Keys enter as E = exp(K - ref) (masked keys as 0):

* non-causal: ref is the global per-channel key maximum, visible to every row, so every factor is <= 1;
* causal: every shift that row t uses depends on keys t' <= t only, so that the output at t is bit-for-bit
  independent of later inputs. Block J's keys are stored once, relative to rho_J, the running maximum at the
  block's first row (at its first unmasked row when no key before it is unmasked); K - rho_J is formed in float64,
  because it can be large for the keys that matter (a float32 difference of size A is off by up to A * 2^-24).
  Row block I reads its own block directly (E <= exp(m_t - rho_I) for the keys row t sees) and an earlier block J
  through the factor exp(rho_J - rho_I) <= 1, or, when that gap exceeds GAP, through exp(rho_J - m_end_J) and then
  exp(m_end_J - rho_I) (m_end_J: the running maximum at the block's end), so that no factor underflows while the
  product it forms still matters. The carry scales each block total to m_end_J, scans with the decays
  exp(m_end_J' - m_end_J) <= 1 and brings it to rho_I. All these factors are formed in float64.
  The only limit is overflow inside a block: E is capped at exp(CAP). In a block where some key exceeds rho_J by
  more than CAP (rare: a rise of 60 in float32), the copy read by later blocks is made relative to m_end_J instead,
  and the rows that see a capped key are flagged by :func:`causal_shifts` and recomputed by the caller on its exact
  loop path; no other row reads a capped value.

:class:`BlockAft` is one autograd Function for the whole operator (gate, both sums and the division). It saves only
its inputs and recomputes the key buffer and N, D in the backward pass, which applies the transposed products: no
O(T * s * C) tensor is ever held.
"""

from __future__ import annotations

import torch

# cap on the exponent K - rho_I inside the own block (causal); larger rises are flagged for the exact path
CAP = {torch.float32: 60.0, torch.float64: 600.0}
# largest gap rho_I - ref_J bridged by one decay factor; a larger one is bridged in two steps through m_end_J
GAP = {torch.float32: 40.0, torch.float64: 400.0}
_CHUNK = 1 << 18  # elements of (T, C) processed together on a CPU: the temporaries of a chunk stay in cache
_CHUNK_ACCEL = 1 << 24  # on an accelerator: fewer, larger kernels


def block_layout(radius: int, T: int, causal: bool) -> tuple[int, int, int]:
    """Block length L, number of neighbouring key blocks P on each side, number of blocks nb.

    radius: the band covers |t - t'| <= radius (-1: no band, every key has bias 0).
    """
    if radius < 0:
        L = 32
    elif radius < 64:
        L = max(32, -(-(radius + 1) // 8) * 8)
    else:
        L = 64
    L = min(L, T)
    nb = -(-T // L)
    P = min(-(-max(radius, 0) // L), nb - 1)
    return L, P, nb


def block_maxima(k: torch.Tensor, L: int) -> torch.Tensor:
    """Per-block maximum of k (B, T, C) over blocks of L rows (the last one may be short): (B, nb, C)."""
    B, T, C = k.shape
    nf = T // L
    parts = []
    if nf:
        parts.append(k[:, : nf * L].view(B, nf, L, C).amax(dim=2))
    if nf * L < T:
        parts.append(k[:, nf * L :].amax(dim=1, keepdim=True))
    return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]


def _rows_of_blocks(x: torch.Tensor, L: int, T: int) -> torch.Tensor:
    """(B, nb, C) per-block values repeated over the rows of each block: (B, T, C)."""
    return x.repeat_interleave(L, dim=1)[:, :T]


def causal_shifts(kd: torch.Tensor, key_mask: torch.Tensor | None, L: int):
    """Shifts of the causal blocked path: rho (B, nb, C), m_end (B, nb, C), clamped (B, nb, C) bool or None, and the
    rows to recompute exactly, flags (B, T, C) bool or None.

    kd: (B, T, C) detached keys, masked keys replaced by the smallest unmasked key (they never raise a maximum).
    rho_I is the running maximum at row s_I, the block's first row or, when no key up to it is unmasked, its first
    unmasked row (rows before that see no key and give 0 whatever the shift). clamped marks the blocks where some key
    exceeds rho_I by more than CAP; flags marks the rows that see such a key.
    """
    B, T, C = kd.shape
    nb = -(-T // L)
    cap = CAP[kd.dtype]
    m_end = torch.cummax(block_maxima(kd, L), dim=1).values  # (B, nb, C)
    starts = torch.arange(nb, device=kd.device) * L
    if key_mask is None:
        s = starts.expand(B, nb)
    else:
        first = torch.where(key_mask.any(dim=1), key_mask.to(torch.uint8).argmax(dim=1), T)  # (B,) first unmasked
        ends = (starts + L - 1).clamp(max=T - 1)
        s = torch.minimum(torch.maximum(starts, first[:, None]), ends)  # (B, nb)
    ks = kd.gather(1, s.unsqueeze(-1).expand(B, nb, C))  # keys at the rows s_I
    rho = ks.clone()
    rho[:, 1:] = torch.maximum(ks[:, 1:], m_end[:, :-1])  # running maximum at s_I (the rows before s_I are masked)
    clamped = m_end - rho > cap
    if not bool(clamped.any()):
        return rho, m_end, None, None
    flags = torch.cummax(kd, dim=1).values - _rows_of_blocks(rho, L, T) > cap
    return rho, m_end, clamped, flags


def _key_buffer(k, v, mask, ref: torch.Tensor, L: int, P: int, causal: bool, cap: float | None, exact_shift: bool):
    """X = [E * V | E] (B, (nb + P [+ P]) * L, 2C), zero in the P padding blocks in front (and behind when
    non-causal) and in the rows past T; E = exp(min(K - ref_block, cap)) * mask. Returns X and the view E (B, T, C).

    ref: (B, 1, C) (one shift for all rows) or (B, nb, C) (one per block of L rows); cap None: no cap.
    exact_shift: form K - ref in float64 (exact) before the exponential. A float32 difference of size A carries an
    absolute error up to A * 2^-24, a relative error of exp; needed where the shift may lie far below the keys that
    matter (the causal own-block shift).
    """
    B, T, C = k.shape
    nb = -(-T // L)
    X = k.new_empty(B, (nb + P + (0 if causal else P)) * L, 2 * C)
    row0 = P * L
    X[:, :row0].zero_()
    X[:, row0 + T :].zero_()
    E = X[:, row0 : row0 + T, C:]
    refr = ref if ref.shape[1] == 1 else _rows_of_blocks(ref, L, T)  # (B, T or 1, C)
    if exact_shift and k.dtype != torch.float64:
        d = torch.sub(k.double(), refr.double())
        if cap is not None:
            d.clamp_max_(cap)
        E.copy_(d.exp_())
    else:
        torch.sub(k, refr, out=E)
        if cap is not None:
            E.clamp_max_(cap)
        E.exp_()
    if mask is not None:
        E.mul_(mask.unsqueeze(-1))
    torch.mul(E, v, out=X[:, row0 : row0 + T, :C])
    return X, E


def _mixed_buffer(X, k, v, mask, m_end, clamped, L: int, P: int):
    """The key buffer of the earlier-block pieces and the carry: X itself, except that the clamped blocks hold
    exp(K - m_end_J) (never capped). Returns Xm, its view Em (B, T, C) and the shifts ref (B, nb, C) of its blocks."""
    B, T, C = k.shape
    nb = m_end.shape[1]
    X2, _ = _key_buffer(k, v, mask, m_end, L, P, True, None, False)
    sel = clamped[:, :, None, None, :]  # (B, nb, 1, 1, C)
    Xm = X.clone()
    mv = Xm.view(B, -1, L, 2, C)[:, P : P + nb]
    mv.copy_(torch.where(sel, X2.view(B, -1, L, 2, C)[:, P : P + nb], mv))
    return Xm, Xm[:, P * L : P * L + T, C:]


def hillis_steele(out: torch.Tensor, m: torch.Tensor, dim: int, reverse: bool) -> None:
    """In-place decayed scan of out along dim, log2(n) passes.

    forward: out_i <- sum_{i' <= i} exp(m_i' - m_i) out_i';  reverse: out_i <- sum_{i' >= i} exp(m_i - m_i') out_i'.
    m (broadcastable to out, possibly float64 for exact factors) must be non-decreasing along dim, so every factor is
    at most 1. The value at i depends only on the entries on its side (i' <= i forward).
    """
    n = out.shape[dim]
    d = 1
    while d < n:
        decay = torch.exp(m.narrow(dim, 0, n - d) - m.narrow(dim, d, n - d)).to(out.dtype)  # all <= 1
        # the product is formed first: source and destination overlap
        if reverse:
            out.narrow(dim, 0, n - d).add_(decay * out.narrow(dim, d, n - d))
        else:
            out.narrow(dim, d, n - d).add_(decay * out.narrow(dim, 0, n - d))
        d *= 2


class _Shifts:
    """Shift-dependent factors of one chunk (rows b0.., channels c0..), shared by the forward and backward passes.

    causal: row block I has shift rho_I; the earlier-block pieces j < P (key block J = I - P + j) read Xm, whose
    block J has shift ref_J, and are scaled by d1_j (per key block: exp(ref_J - m_end_J), or None when it is 1
    everywhere) then d2_j (exp(ref_J - rho_I), or exp(m_end_J - rho_I) after d1). The carry sums Xm per block,
    scales the sums to m_end_J (s_early), scans with m_end and brings block I - P - 1 to rho_I (s_carry).
    """

    def __init__(self, rho, m_end, ref, causal: bool, P: int, nb: int):
        self.causal, self.P, self.nb = causal, P, nb
        self.d1: list[torch.Tensor | None] = [None] * (2 * P + 1)
        self.d2: list[torch.Tensor | None] = [None] * (2 * P + 1)
        if not causal:
            return
        gap = GAP[rho.dtype]
        dt = rho.dtype
        # the factors are formed in float64: their arguments can be large while the products they make are not
        rho, m_end, ref = rho.double(), m_end.double(), ref.double()
        self.m_end = m_end.unsqueeze(2)  # (Bc, nb, 1, C) float64, for the scan over blocks
        self.s_early = torch.exp(ref - m_end).unsqueeze(2).to(dt)  # <= 1
        g = P + 1
        if nb > g:
            self.s_carry = torch.exp(m_end[:, : nb - g] - rho[:, g:]).unsqueeze(2).to(dt)  # (Bc, nb - g, 1, C) <= 1
        # the P blocks in front hold zeros: give them the shift rho_0, so that their factors are 1
        front = rho[:, :1].expand(-1, P, -1)
        refp, mendp = torch.cat([front, ref], dim=1), torch.cat([front, m_end], dim=1)
        for j in range(P):
            rJ, mJ = refp[:, j : j + nb], mendp[:, j : j + nb]
            one_step = rho - rJ <= gap
            self.d2[j] = torch.where(one_step, torch.exp(rJ - rho), torch.exp(mJ - rho))[:, :, None, None, :].to(dt)
            if not bool(one_step.all()):
                d1 = torch.where(one_step, torch.ones_like(rJ), torch.exp(rJ - mJ))
                self.d1[j] = d1[:, :, None, None, :].to(dt)


def _carry(S: torch.Tensor, sh: _Shifts) -> torch.Tensor:
    """Sum over the key blocks beyond the P neighbours of each row block, relative to that row block's shift.

    S: (Bc, nb, 2C) per-block totals of the key buffer (Xm when causal); nb > P + 1. Returns (Bc, nb, 2C).
    """
    Bc, nb, C2 = S.shape
    g = sh.P + 1  # first block distance outside the neighbourhood
    carry = torch.zeros_like(S)
    if sh.causal:
        pc = S.view(Bc, nb, 2, -1) * sh.s_early  # relative to m_end_J
        hillis_steele(pc, sh.m_end, 1, reverse=False)  # inclusive sums over blocks <= J, relative to m_end_J
        carry.view(Bc, nb, 2, -1)[:, g:] = pc[:, : nb - g] * sh.s_carry
    else:  # sums of positive terms on both sides, never "total minus window"
        carry[:, g:] = torch.cumsum(S[:, : nb - g], dim=1)
        carry[:, : nb - g] += torch.flip(torch.cumsum(torch.flip(S[:, g:], [1]), dim=1), [1])
    return carry


def _carry_backward(gc: torch.Tensor, sh: _Shifts) -> torch.Tensor:
    """Transpose of :func:`_carry`: gradient with respect to the per-block totals."""
    Bc, nb, C2 = gc.shape
    g = sh.P + 1
    if sh.causal:
        gpc = torch.zeros_like(gc).view(Bc, nb, 2, -1)
        gpc[:, : nb - g] = gc.view(Bc, nb, 2, -1)[:, g:] * sh.s_carry
        hillis_steele(gpc, sh.m_end, 1, reverse=True)
        return (gpc * sh.s_early).view(Bc, nb, C2)
    gS = torch.zeros_like(gc)
    gS[:, : nb - g] = torch.flip(torch.cumsum(torch.flip(gc[:, g:], [1]), dim=1), [1])
    gS[:, g:] += torch.cumsum(gc[:, : nb - g], dim=1)
    return gS


def _expand(f: torch.Tensor, nb: int) -> torch.Tensor:
    return f.expand(nb, -1, -1) if f.shape[0] != nb else f


def _chunks(B: int, T: int, C: int, device: torch.device) -> list[tuple[int, int, int, int]]:
    """(b0, b1, c0, c1) pieces of the batch and channel dimensions processed together (channels are independent)."""
    size = _CHUNK if device.type == "cpu" else _CHUNK_ACCEL
    if T * C <= size:
        n = size // (T * C)
        return [(b, min(B, b + n), 0, C) for b in range(0, B, n)]
    cc = min(C, max(16, (size // T) // 16 * 16))
    return [(b, b + 1, c, min(C, c + cc)) for b in range(B) for c in range(0, C, cc)]


def _num_den(X, Xm, fmat, cvec, sh: _Shifts, b0: int, L: int) -> torch.Tensor:
    """[N | D] (Bc, nb * L, 2C) of the batch rows b0 .. b0 + Bc, from their key buffers X (own block) and Xm.

    N and D of row t in block I are relative to rho_I + wmax_t (no row rescaling: it cancels in N / D).
    """
    Bc, R, C2 = X.shape
    C, P, nb = C2 // 2, sh.P, sh.nb
    K, Bf = fmat.shape[0], fmat.shape[1]
    Xb, Xmb = X.view(Bc, -1, L, C2), Xm.view(Bc, -1, L, C2)
    carry = None
    if nb > P + 1:
        carry = _carry(Xmb[:, P : P + nb].sum(dim=2), sh).unsqueeze(2)  # (Bc, nb, 1, 2C)
    out = X.new_empty(Bc, nb * L, C2)
    for b in range(Bc):
        fb = fmat[:, b0 + b if Bf > 1 else 0]
        ob = out[b].view(nb, L, C2)
        if carry is not None and cvec is None:
            torch.baddbmm(carry[b].expand(nb, L, C2), _expand(fb[P], nb), Xb[b, P : P + nb], out=ob)
        else:
            torch.bmm(_expand(fb[P], nb), Xb[b, P : P + nb], out=ob)
        for j in range(K):
            if j == P:
                continue
            if sh.d2[j] is None:
                ob.baddbmm_(_expand(fb[j], nb), Xmb[b, j : j + nb])
            else:
                part = torch.bmm(_expand(fb[j], nb), Xmb[b, j : j + nb]).view(nb, L, 2, C)
                if sh.d1[j] is not None:
                    part.mul_(sh.d1[j][b])
                ob.view(nb, L, 2, C).addcmul_(part, sh.d2[j][b])
        if carry is not None and cvec is not None:
            ob.addcmul_(cvec[b0 + b if Bf > 1 else 0], carry[b])
    return out


class BlockAft(torch.autograd.Function):
    """y = sigmoid(q) * N / D for per-channel keys with a banded bias, blocked as described in the module docstring.

    Nothing but the inputs is saved: the backward pass recomputes the key buffers and N, D (a third more matrix
    work) and applies the transposed products.

    Args (forward):
        q, k, v: (B, T, C) in the compute dtype; k with masked keys replaced (see :func:`causal_shifts`).
        fmat: (K, Bf, nbF, L, L) bias factors, K = 2P + 1 (non-causal) or P + 1 (causal); piece j pairs row block I
            with key block I - P + j. Bf in {1, B}; nbF in {1, nb} (1: shared by every block).
        cvec: (Bf, nb, L, 1) weight of the keys beyond the neighbourhood (exp(-wmax_t)), or None for 1.
        mask: (B, T) in the compute dtype, or None.
        rho: (B, 1, C) non-causal (the global key maximum); (B, nb, C) causal, with m_end and clamped as returned by
            :func:`causal_shifts` (None when non-causal).
        causal, L, P: layout.
    """

    @staticmethod
    def forward(ctx, q, k, v, fmat, cvec, mask, rho, m_end, clamped, causal: bool, L: int, P: int):
        B, T, C = q.shape
        nb = -(-T // L)
        tiny = torch.finfo(q.dtype).tiny
        y = torch.empty_like(q)
        for b0, b1, c0, c1 in _chunks(B, T, C, q.device):
            X, Xm, _, _, sh = _buffers(k, v, mask, rho, m_end, clamped, causal, L, P, nb, b0, b1, c0, c1)
            out = _num_den(X, Xm, fmat, cvec, sh, b0, L)
            del X, Xm
            Cc = c1 - c0
            den = out[:, :T, Cc:].clamp_min_(tiny)  # rows that see no key: N = 0, so N / D = 0
            torch.div(out[:, :T, :Cc], den, out=y[b0:b1, :, c0:c1]).mul_(torch.sigmoid(q[b0:b1, :, c0:c1]))
            del out, den
        ctx.save_for_backward(q, k, v, fmat, cvec, mask, rho, m_end, clamped)
        ctx.layout = (causal, L, P)
        return y

    @staticmethod
    def backward(ctx, gy):
        q, k, v, fmat, cvec, mask, rho, m_end, clamped = ctx.saved_tensors
        causal, L, P = ctx.layout
        B, T, C = q.shape
        nb = -(-T // L)
        K, Bf, nbF = fmat.shape[0], fmat.shape[1], fmat.shape[2]
        tiny = torch.finfo(q.dtype).tiny
        need_f = ctx.needs_input_grad[3]
        gy = gy.contiguous()
        gq, gk, gv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        gF = torch.zeros_like(fmat) if need_f else None
        for b0, b1, c0, c1 in _chunks(B, T, C, q.device):
            bs, cs, Bc, Cc = slice(b0, b1), slice(c0, c1), b1 - b0, c1 - c0
            X, Xm, E, Em, sh = _buffers(k, v, mask, rho, m_end, clamped, causal, L, P, nb, b0, b1, c0, c1)
            out = _num_den(X, Xm, fmat, cvec, sh, b0, L)
            den = out[:, :T, Cc:].clamp_min_(tiny)
            yr = out[:, :T, :Cc].div_(den)  # N / D
            s = torch.sigmoid(q[bs, :, cs])
            g = gy[bs, :, cs]
            # gradients of N and D (relative to the same shifts as N and D)
            gN = torch.mul(g, s).div_(den)
            if mask is not None:  # rows without any visible key get no gradient
                gN.masked_fill_(den <= tiny, 0)
            torch.ops.aten.sigmoid_backward(g * yr, s, grad_input=gq[bs, :, cs])
            G = out  # reuse the buffer: gN and gD replace N / D and D
            torch.mul(gN, yr, out=G[:, :T, Cc:]).neg_()
            G[:, :T, :Cc] = gN
            G[:, T:] = 0
            del gN, s, yr, den
            Gb = G.view(Bc, nb, L, 2 * Cc)
            gS = None
            if nb > P + 1:
                gc = Gb.sum(dim=2) if cvec is None else torch.matmul(_rows(cvec, b0, Bc).transpose(-1, -2), Gb)
                gS = _carry_backward(gc.view(Bc, nb, 2 * Cc), sh).unsqueeze(2)  # (Bc, nb, 1, 2Cc)
            Xb, Xmb = X.view(Bc, -1, L, 2 * Cc), Xm.view(Bc, -1, L, 2 * Cc)
            gX = torch.empty_like(X)
            gXm = gX if Xm is X else torch.zeros_like(X)
            gXb, gXmb = gX.view(Bc, -1, L, 2 * Cc), gXm.view(Bc, -1, L, 2 * Cc)
            gX[:, : P * L].zero_()
            gX[:, (P + nb) * L :].zero_()
            if gS is not None and gXm is not gX:
                gXmb[:, P : P + nb] += gS
            for b in range(Bc):
                fb = fmat[:, b0 + b if Bf > 1 else 0]
                for j in [P] + [i for i in range(K) if i != P]:  # own piece first: it covers every real key block
                    Gj, src = Gb[b], Xmb[b, j : j + nb]
                    if sh.d2[j] is not None:
                        Gj = Gj.view(nb, L, 2, Cc) * sh.d2[j][b]
                        if sh.d1[j] is not None:
                            Gj.mul_(sh.d1[j][b])
                        Gj = Gj.view(nb, L, 2 * Cc)
                    Ft = _expand(fb[j], nb).transpose(1, 2)
                    if j != P:
                        gXmb[b, j : j + nb].baddbmm_(Ft, Gj)
                    else:
                        src = Xb[b, P : P + nb]
                        if gS is not None and gXm is gX:
                            torch.baddbmm(gS[b].expand(nb, L, 2 * Cc), Ft, Gj, out=gXb[b, P : P + nb])
                        else:
                            torch.bmm(Ft, Gj, out=gXb[b, P : P + nb])
                    if need_f:  # (nb, L, L) products of the gradients with the keys
                        if nbF == 1:
                            gF[j, b0 + b if Bf > 1 else 0] += torch.bmm(Gj, src.mT).sum(0, keepdim=True)
                        else:
                            gF[j, b0 + b if Bf > 1 else 0].baddbmm_(Gj, src.mT)
            del G, Gb, out
            rows = slice(P * L, P * L + T)
            gXN, gXD = gX[:, rows, :Cc], gX[:, rows, Cc:]
            torch.mul(gXN, E, out=gv[bs, :, cs])
            torch.addcmul(gXD, gXN, v[bs, :, cs], out=gk[bs, :, cs]).mul_(E)  # d/dK of [E V | E], E = exp(K - ref)
            if gXm is not gX:  # the clamped blocks' second buffer (a capped E gets no gradient: flagged rows only)
                gXN, gXD = gXm[:, rows, :Cc], gXm[:, rows, Cc:]
                gv[bs, :, cs].addcmul_(gXN, Em)
                gk[bs, :, cs].addcmul_(torch.addcmul(gXD, gXN, v[bs, :, cs]), Em)
            del X, Xm, E, Em, gX, gXm
        return gq, gk, gv, gF, None, None, None, None, None, None, None, None


def _buffers(k, v, mask, rho, m_end, clamped, causal: bool, L: int, P: int, nb: int, b0, b1, c0, c1):
    """Key buffers X, Xm with their E views and the shift factors of one chunk."""
    bs, cs = slice(b0, b1), slice(c0, c1)
    kc, vc = k[bs, :, cs], v[bs, :, cs]
    mk = None if mask is None else mask[bs]
    r = rho[bs, :, cs]
    cl = None if clamped is None else clamped[bs, :, cs]
    if cl is not None and not bool(cl.any()):
        cl = None
    X, E = _key_buffer(kc, vc, mk, r, L, P, causal, None if cl is None else CAP[k.dtype], causal)
    if cl is None:
        Xm, Em, ref = X, E, r
    else:
        Xm, Em = _mixed_buffer(X, kc, vc, mk, m_end[bs, :, cs], cl, L, P)
        ref = torch.where(cl, m_end[bs, :, cs], r)
    sh = _Shifts(r, None if m_end is None else m_end[bs, :, cs], ref, causal, P, nb)
    return X, Xm, E, Em, sh


def _rows(x: torch.Tensor, b0: int, n: int) -> torch.Tensor:
    """Rows b0 .. b0 + n of a tensor with a broadcast (size 1) or full batch dimension."""
    return x if x.shape[0] == 1 else x[b0 : b0 + n]
