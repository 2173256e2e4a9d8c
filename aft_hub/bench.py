"""Benchmarks of the AFT operators (Zhai et al., "An Attention Free Transformer", arXiv:2105.14103).

:func:`run_ops_benchmark` times forward + backward of each operator of :mod:`aft_hub.ops` (median of a few repeats
after warm-up) and measures the peak CPU memory it allocates, next to

* its float64 loop reference (small T only: it is a Python loop over positions),
* ``torch.nn.functional.scaled_dot_product_attention`` at the same (B, T, C), causal and not,
* the PyPI package ``aft-pytorch`` (imported only if installed; it has its own projections, so its module
  forward + backward is timed at the same B, T, C, and whether its output and gradients are finite is reported).

:func:`write_ops_report` writes a Markdown table and a log-log plot. ``scripts/benchmark.py ops`` and the
``aft-hub bench`` command are thin command lines over :func:`run` and :func:`main`.

Peak memory is the largest running sum of the CPU allocation events that ``torch.profiler`` (``profile_memory=True``)
records during one forward + backward, i.e. the peak above what was allocated before the call (the inputs).
:func:`check_peak_memory_method` verifies it on allocations of known size.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib.metadata
import json
import logging
import math
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from aft_hub.ops import functional as aft
from aft_hub.ops import reference as aft_ref

logger = logging.getLogger(__name__)

__all__ = [
    "OpsBenchConfig",
    "OpsResult",
    "peak_memory_bytes",
    "check_peak_memory_method",
    "median_times",
    "machine_info",
    "run_ops_benchmark",
    "format_ops_report",
    "plot_ops",
    "write_ops_report",
    "add_ops_arguments",
    "build_parser",
    "run",
    "main",
]

OPS = ("aft_simple", "aft_local", "aft_full", "aft_conv1d", "aft_conv2d")
CAUSAL_OPS = ("aft_simple", "aft_local", "aft_full", "aft_conv1d")  # aft_conv2d has no causal mode
IMPL_AFT_HUB = "aft_hub"
IMPL_REFERENCE = "reference"
IMPL_SDPA = "sdpa"
IMPL_AFT_PYTORCH = "aft-pytorch"
_AFT_PYTORCH_CLASSES = {"aft_full": "AFTFull", "aft_simple": "AFTSimple", "aft_local": "AFTLocal"}
_MIB = 2**20


# ----------------------------------------------------------------------------------------------------------------
# measuring
# ----------------------------------------------------------------------------------------------------------------


def peak_memory_bytes(fn: Callable[[], object]) -> int:
    """Peak CPU memory allocated by ``fn()`` above what was allocated before the call, in bytes.

    ``torch.profiler`` with ``profile_memory=True`` records one ``[memory]`` event per allocation (positive size) and
    per release (negative size) of the CPU allocator; the peak is the largest running sum of these events in time
    order. Memory freed during the call that was allocated before it makes the running sum negative; the result is
    clamped at 0. The value returned by ``fn`` is dropped inside the profiled region, so it counts as released.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        raise RuntimeError("This torch build's profiler exposes no kineto results: cannot measure peak memory.")
    events = [e for e in results.events() if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]
    events.sort(key=lambda e: e.start_ns())
    running = peak = 0
    for e in events:
        running += e.nbytes()
        peak = max(peak, running)
    return peak


def check_peak_memory_method(nbytes: int = 8 * _MIB) -> int:
    """Check :func:`peak_memory_bytes` on allocations of known size and return the measured peak.

    Allocates a, b (nbytes, nbytes // 2), frees a, allocates c (2 * nbytes): the peak is 2.5 * nbytes.

    Raises:
        RuntimeError: the measured peak is not 2.5 * nbytes within 1 %.
    """

    def allocate() -> None:
        a = torch.empty(nbytes, dtype=torch.uint8)
        b = torch.empty(nbytes // 2, dtype=torch.uint8)
        del a
        c = torch.empty(2 * nbytes, dtype=torch.uint8)
        del b, c

    measured = peak_memory_bytes(allocate)
    expected = 2.5 * nbytes
    if abs(measured - expected) > 0.01 * expected:
        raise RuntimeError(f"Peak memory measurement is off: expected {expected:.0f} bytes, measured {measured}.")
    return measured


def median_times(fn: Callable[[], object], repeats: int, warmup: int) -> tuple[float, float]:
    """Median wall time and median process CPU time (all threads) of ``fn()`` in seconds, over ``repeats`` calls
    after ``warmup`` untimed calls. CPU time is less sensitive than wall time to other processes on the machine."""
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(max(1, repeats)):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def machine_info() -> dict[str, str]:
    """CPU model, core count, torch threads, versions, load average and the date, for the report."""
    return {
        "cpu": _cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "torch_threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "aft-pytorch": _package_version("aft-pytorch") or "not installed",
        "load": _load_average(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


# ----------------------------------------------------------------------------------------------------------------
# configurations
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class OpsBenchConfig:
    """What :func:`run_ops_benchmark` measures.

    Args:
        seq_lens: sequence lengths T (for aft_conv2d, T tokens on the most square H x W grid).
        channels: C, the width of q, k and v.
        batch: B.
        ops: operators of :mod:`aft_hub.ops` to measure.
        window: aft_local window s.
        conv_heads: heads h of aft_conv1d and aft_conv2d (k has h channels).
        conv1d_kernel: aft_conv1d kernel size (odd).
        conv2d_kernel: aft_conv2d kernel size (odd).
        sdpa_heads: heads of the scaled_dot_product_attention baseline (C // sdpa_heads per head).
        repeats: timed repeats (the median is reported).
        warmup: untimed calls before the timed ones.
        reference_max_t: the float64 loop reference is measured only at T <= this.
        time_budget_s: skip a configuration when one call, extrapolated quadratically in T from the last size measured,
            would take longer than this; a configuration whose first call shows that warm-up, repeats and the memory
            run would exceed it is timed on that one call.
        with_reference, with_sdpa, with_aft_pytorch: which baselines to measure.
        seed: seed of the random inputs.
    """

    seq_lens: tuple[int, ...] = (256, 1024, 4096)
    channels: int = 256
    batch: int = 2
    ops: tuple[str, ...] = OPS
    window: int = 32
    conv_heads: int = 16
    conv1d_kernel: int = 63
    conv2d_kernel: int = 11
    sdpa_heads: int = 4
    repeats: int = 3
    warmup: int = 1
    reference_max_t: int = 256
    time_budget_s: float = 60.0
    with_reference: bool = True
    with_sdpa: bool = True
    with_aft_pytorch: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [op for op in self.ops if op not in OPS]
        if unknown:
            raise ValueError(f"Unknown operators {unknown}; choose from {list(OPS)}.")
        if self.channels % self.conv_heads or self.channels % self.sdpa_heads:
            raise ValueError(
                f"channels {self.channels} must be divisible by conv_heads {self.conv_heads} "
                f"and sdpa_heads {self.sdpa_heads}."
            )
        if self.conv1d_kernel % 2 == 0 or self.conv2d_kernel % 2 == 0:
            raise ValueError("Kernel sizes must be odd.")
        if any(t < 1 for t in self.seq_lens):
            raise ValueError(f"Sequence lengths must be >= 1, got {self.seq_lens}.")

    @classmethod
    def quick(cls, **overrides) -> OpsBenchConfig:
        """A configuration that runs in well under a minute on 2 cores (a smoke test of the whole pipeline)."""
        values = dict(seq_lens=(64, 256), channels=64, batch=1, repeats=2, warmup=1, reference_max_t=64)
        values.update(overrides)
        return cls(**values)


@dataclasses.dataclass
class OpsResult:
    """One measured (or skipped) configuration. Times in milliseconds (wall and process CPU time, all threads),
    memory in MiB; None when not measured."""

    op: str
    impl: str
    causal: bool
    batch: int
    seq_len: int
    channels: int
    time_ms: float | None = None
    cpu_ms: float | None = None
    peak_mib: float | None = None
    finite: bool | None = None
    note: str = ""


def _grid(T: int) -> tuple[int, int]:
    """The most square (H, W) with H * W = T and H <= W."""
    H = max(d for d in range(1, math.isqrt(T) + 1) if T % d == 0)
    return H, T // H


# A "step" runs one forward + backward; with check=True it also returns whether the output and gradients are finite.
Step = Callable[[bool], bool]


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().requires_grad_(True)


def _grad_step(forward: Callable[[], torch.Tensor], inputs: Sequence[torch.Tensor]) -> Step:
    def step(check: bool = False) -> bool:
        y = forward()
        grads = torch.autograd.grad(y.float().sum(), list(inputs))
        if not check:
            return True
        return bool(torch.isfinite(y).all()) and all(bool(torch.isfinite(g).all()) for g in grads)

    return step


def _aft_step(op: str, impl: str, B: int, T: int, C: int, causal: bool, cfg: OpsBenchConfig, gen) -> Step:
    """Forward + backward of an aft_hub operator or of its float64 loop reference, gradients for every input."""
    fns = {
        IMPL_AFT_HUB: {o: getattr(aft, o) for o in OPS},
        IMPL_REFERENCE: {o: getattr(aft_ref, f"{o}_reference") for o in OPS},
    }[impl]
    fn = fns[op]

    def randn(*shape, scale: float = 1.0) -> torch.Tensor:
        return _leaf(torch.randn(*shape, generator=gen) * scale)

    h = cfg.conv_heads
    if op == "aft_conv2d":
        H, W = _grid(T)
        q, k, v = randn(B, C, H, W), randn(B, h, H, W), randn(B, C, H, W)
        weight = randn(h, cfg.conv2d_kernel, cfg.conv2d_kernel, scale=0.1)
        return _grad_step(lambda: fn(q, k, v, weight), (q, k, v, weight))
    q, v = randn(B, T, C), randn(B, T, C)
    k = randn(B, T, h if op == "aft_conv1d" else C)
    if op == "aft_simple":
        return _grad_step(lambda: fn(q, k, v, causal=causal), (q, k, v))
    if op == "aft_conv1d":
        weight = randn(h, cfg.conv1d_kernel, scale=0.1)
        return _grad_step(lambda: fn(q, k, v, weight, causal=causal), (q, k, v, weight))
    pos_bias = randn(T, T, scale=0.1)  # a learned (T, T) bias: its gradient is (T, T) too
    if op == "aft_local":
        return _grad_step(lambda: fn(q, k, v, pos_bias, cfg.window, causal=causal), (q, k, v, pos_bias))
    return _grad_step(lambda: fn(q, k, v, pos_bias, causal=causal), (q, k, v, pos_bias))


def _sdpa_step(B: int, T: int, C: int, causal: bool, heads: int, gen) -> Step:
    """scaled_dot_product_attention on (B, T, C) inputs split into ``heads`` heads, gradients for q, k, v."""
    q, k, v = (_leaf(torch.randn(B, T, C, generator=gen)) for _ in range(3))
    D = C // heads

    def forward() -> torch.Tensor:
        qh, kh, vh = (x.view(B, T, heads, D).transpose(1, 2) for x in (q, k, v))  # (B, heads, T, D)
        y = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
        return y.transpose(1, 2).reshape(B, T, C)

    return _grad_step(forward, (q, k, v))


def _aft_pytorch_step(op: str, B: int, T: int, C: int, cfg: OpsBenchConfig, gen) -> Step:
    """The aft-pytorch module (its own q, k, v and output projections, hidden_dim = C), gradients for x and weights."""
    import aft_pytorch

    cls = getattr(aft_pytorch, _AFT_PYTORCH_CLASSES[op])
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (), generator=gen)))
    kwargs = {"s": cfg.window} if op == "aft_local" else {}
    module = cls(max_seqlen=T, dim=C, hidden_dim=C, **kwargs)
    x = _leaf(torch.randn(B, T, C, generator=gen))

    def step(check: bool = False) -> bool:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # AFTLocal converts grad-requiring tensors to Python scalars
            y = module(x)
        params = [x, *module.parameters()]  # AFTLocal replaces its bias Parameter in every forward
        grads = torch.autograd.grad(y.sum(), params, allow_unused=True)
        if not check:
            return True
        return bool(torch.isfinite(y).all()) and all(g is None or bool(torch.isfinite(g).all()) for g in grads)

    return step


def _planned(cfg: OpsBenchConfig, aft_pytorch_available: bool) -> list[tuple[str, str, bool, int]]:
    """Every (op, impl, causal, T) to measure, in order; SDPA rows have op 'sdpa'."""
    plan = []
    for causal in (False, True):
        for op in cfg.ops:
            if causal and op not in CAUSAL_OPS:
                continue
            for T in cfg.seq_lens:
                plan.append((op, IMPL_AFT_HUB, causal, T))
            if cfg.with_reference:
                for T in cfg.seq_lens:
                    if T <= cfg.reference_max_t:
                        plan.append((op, IMPL_REFERENCE, causal, T))
            if cfg.with_aft_pytorch and aft_pytorch_available and not causal and op in _AFT_PYTORCH_CLASSES:
                for T in cfg.seq_lens:
                    plan.append((op, IMPL_AFT_PYTORCH, causal, T))
        if cfg.with_sdpa:
            for T in cfg.seq_lens:
                plan.append(("sdpa", IMPL_SDPA, causal, T))
    return plan


def _aft_pytorch_available() -> bool:
    try:
        import aft_pytorch  # noqa: F401
    except ImportError:
        return False
    return True


def _measure(step: Step, cfg: OpsBenchConfig, single: bool = False) -> tuple[float, float, int, bool, str]:
    """Median wall and CPU seconds per forward + backward, peak bytes, whether output and gradients are finite, and a
    note.

    With ``single`` (the float64 loop references) or when the calls are too slow for the time budget, the first call
    is the only timed one.
    """
    first_wall, first_cpu = median_times(lambda: step(False), repeats=1, warmup=0)  # also the first warm-up call
    warmup, repeats = max(0, cfg.warmup - 1), cfg.repeats
    if single:
        (wall, cpu), note = (first_wall, first_cpu), "1 call, no warm-up"
    elif first_wall * (warmup + repeats + 1) > cfg.time_budget_s:
        (wall, cpu), note = (first_wall, first_cpu), "1 call, no warm-up (slow)"
    else:
        (wall, cpu), note = median_times(lambda: step(False), repeats=repeats, warmup=warmup), ""
    finite: list[bool] = []
    peak = peak_memory_bytes(lambda: finite.append(step(True)))
    return wall, cpu, peak, finite[0], note


def run_ops_benchmark(cfg: OpsBenchConfig, progress: bool = True) -> list[OpsResult]:
    """Measure every configuration of ``cfg``; returns one :class:`OpsResult` per configuration, skipped ones too."""
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    logger.info("load average (1, 5, 15 min) at start: %s on %s cores", _load_average(), os.cpu_count())
    check_peak_memory_method()
    available = _aft_pytorch_available()
    if cfg.with_aft_pytorch and not available:
        logger.info("aft-pytorch is not installed: its rows are left out.")
    plan = _planned(cfg, available)
    B, C = cfg.batch, cfg.channels
    results: list[OpsResult] = []
    last_single_s: dict[tuple[str, str, bool], tuple[int, float]] = {}  # (op, impl, causal) -> (T, seconds per call)
    with logging_redirect_tqdm():
        for op, impl, causal, T in tqdm(plan, desc="ops benchmark", unit="config", disable=not progress):
            result = OpsResult(op=op, impl=impl, causal=causal, batch=B, seq_len=T, channels=C)
            results.append(result)
            key = (op, impl, causal)
            if key in last_single_s:  # one call extrapolated quadratically in T from the last size measured
                prev_T, prev_s = last_single_s[key]
                estimate = prev_s * (T / prev_T) ** 2
                if estimate > cfg.time_budget_s:
                    result.note = f"skipped: estimated {estimate:.0f} s per call (> {cfg.time_budget_s:.0f} s)"
                    logger.info("%s %s causal=%s T=%d %s", op, impl, causal, T, result.note)
                    continue
            gen = torch.Generator().manual_seed(cfg.seed)
            if impl == IMPL_SDPA:
                step = _sdpa_step(B, T, C, causal, cfg.sdpa_heads, gen)
            elif impl == IMPL_AFT_PYTORCH:
                step = _aft_pytorch_step(op, B, T, C, cfg, gen)
            else:
                step = _aft_step(op, impl, B, T, C, causal, cfg, gen)
            wall, cpu, peak, finite, note = _measure(step, cfg, single=impl == IMPL_REFERENCE)
            del step
            gc.collect()
            last_single_s[key] = (T, wall)
            result.time_ms, result.cpu_ms, result.peak_mib = wall * 1e3, cpu * 1e3, peak / _MIB
            result.finite, result.note = finite, note
            logger.info(
                "%-10s %-11s causal=%-5s T=%-5d %9.2f ms (cpu %9.2f ms) %9.1f MiB finite=%s",
                op, impl, causal, T, result.time_ms, result.cpu_ms, result.peak_mib, result.finite,
            )  # fmt: skip
    return results


# ----------------------------------------------------------------------------------------------------------------
# reporting
# ----------------------------------------------------------------------------------------------------------------


def _fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def _impl_label(impl: str, cfg: OpsBenchConfig) -> str:
    return {
        IMPL_AFT_HUB: "aft_hub",
        IMPL_REFERENCE: "float64 loop reference",
        IMPL_SDPA: f"SDPA ({cfg.sdpa_heads} heads)",
        IMPL_AFT_PYTORCH: f"aft-pytorch {_package_version('aft-pytorch') or ''}".strip(),
    }[impl]


def _op_label(op: str, cfg: OpsBenchConfig) -> str:
    return {
        "aft_local": f"aft_local (window {cfg.window})",
        "aft_conv1d": f"aft_conv1d (h {cfg.conv_heads}, kernel {cfg.conv1d_kernel})",
        "aft_conv2d": f"aft_conv2d (h {cfg.conv_heads}, kernel {cfg.conv2d_kernel}x{cfg.conv2d_kernel})",
        "sdpa": f"scaled_dot_product_attention ({cfg.sdpa_heads} heads)",
    }.get(op, op)


def format_ops_report(
    results: Sequence[OpsResult],
    cfg: OpsBenchConfig,
    info: dict[str, str],
    command: str,
    load_at_start: str | None = None,
    wall_s: float | None = None,
) -> str:
    """The Markdown report: machine, command, a time summary (ms by T) and every measurement."""
    seq_lens = list(cfg.seq_lens)
    load = f"{load_at_start} at start, {info['load']} at the end" if load_at_start else info["load"]
    lines = [
        "# AFT operators: forward + backward benchmark",
        "",
        f"- Command: `{command}`",
        f"- Date: {info['date']}" + (f"; the run took {wall_s / 60:.1f} min" if wall_s is not None else ""),
        f"- Machine: {info['cpu']}, {info['cpu_count']} cores, torch {info['torch']} "
        f"({info['torch_threads']} threads), Python {info['python']}, {info['platform']}",
        f"- Load average (1, 5, 15 min): {load}. Times are only comparable on an otherwise idle machine "
        f"(load well under {info['cpu_count']}).",
        f"- aft-pytorch: {info['aft-pytorch']}",
        f"- Shapes: B = {cfg.batch}, C = {cfg.channels}, T in {seq_lens}; float32 inputs on CPU. aft_conv2d puts the "
        f"T tokens on an H x W grid ({', '.join('x'.join(map(str, _grid(t))) for t in seq_lens)}).",
        f"- Time: median wall time of {cfg.repeats} forward + backward calls after {cfg.warmup} warm-up call(s); "
        "the loss is the sum of the output and gradients are taken for every input (q, k, v and the bias or kernel). "
        "The process CPU time (all threads) of the same calls is listed too; both are inflated when other processes "
        "compete for the cores (intra-op threads then wait for each other).",
        "- Peak memory: largest running sum of the CPU allocation events recorded by torch.profiler "
        "(profile_memory=True) during one forward + backward, above what was allocated before (the inputs); "
        "the method is checked on allocations of known size before the run.",
        "- aft_local and aft_full take a learned (T, T) pos_bias: their peak includes its (T, T) gradient "
        f"({4 * max(seq_lens) ** 2 / _MIB:.1f} MiB at T = {max(seq_lens)}).",
        f"- The float64 loop reference is measured at T <= {cfg.reference_max_t} only, one call without warm-up.",
        "- aft-pytorch modules include their own q, k, v and output projections (hidden_dim = C); the package has "
        "no causal mode and no AFT-conv (AFTConv is a stub). 'finite' says whether its output and gradients were "
        f"finite. A configuration whose single call would take more than {cfg.time_budget_s:.0f} s (extrapolated "
        "quadratically in T from the previous size) is skipped and marked so; one whose repeats would exceed that "
        "is timed on its first call.",
        "",
        "## Time (ms, forward + backward)",
        "",
        "| operator | implementation | causal | " + " | ".join(f"T={t}" for t in seq_lens) + " |",
        "|---|---|---|" + "---:|" * len(seq_lens),
    ]
    by_key: dict[tuple[str, str, bool], dict[int, OpsResult]] = {}
    for r in results:
        by_key.setdefault((r.op, r.impl, r.causal), {})[r.seq_len] = r
    for (op, impl, causal), row in by_key.items():
        cells = []
        for t in seq_lens:
            r = row.get(t)
            if r is None:
                cells.append("")
            elif r.time_ms is None:
                cells.append("skipped")
            else:
                cells.append(_fmt(r.time_ms))
        lines.append(f"| {_op_label(op, cfg)} | {_impl_label(impl, cfg)} | {'yes' if causal else 'no'} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    lines += [
        "",
        "## All measurements",
        "",
        "| operator | implementation | causal | B | T | C | wall (ms) | CPU (ms) | peak mem (MiB) | finite | note |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        finite = "–" if r.finite is None else ("yes" if r.finite else "**no**")
        lines.append(
            f"| {_op_label(r.op, cfg)} | {_impl_label(r.impl, cfg)} | {'yes' if r.causal else 'no'} | {r.batch} | "
            f"{r.seq_len} | {r.channels} | {_fmt(r.time_ms)} | {_fmt(r.cpu_ms)} | {_fmt(r.peak_mib)} | {finite} | "
            f"{r.note} |"
        )
    return "\n".join(lines) + "\n"


def plot_ops(results: Sequence[OpsResult], cfg: OpsBenchConfig, path: str | Path) -> None:
    """Time against T per operator and implementation, log-log, one panel for non-causal and one for causal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {  # line style and marker per implementation
        IMPL_AFT_HUB: ("-", "o"),
        IMPL_REFERENCE: (":", "s"),
        IMPL_AFT_PYTORCH: ("--", "^"),
        IMPL_SDPA: ("-.", "x"),
    }
    colors = {op: f"C{i}" for i, op in enumerate((*OPS, "sdpa"))}
    colors["sdpa"] = "black"
    fig, axes = plt.subplots(1, 2, figsize=(13, 7.5), sharey=True)
    for ax, causal in zip(axes, (False, True)):
        series: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for r in results:
            if r.causal == causal and r.time_ms is not None:
                series.setdefault((r.op, r.impl), []).append((r.seq_len, r.time_ms))
        for (op, impl), points in series.items():
            points.sort()
            xs, ys = zip(*points)
            label = _op_label(op, cfg) if impl in (IMPL_AFT_HUB, IMPL_SDPA) else f"{op}, {_impl_label(impl, cfg)}"
            linestyle, marker = styles[impl]
            ax.plot(xs, ys, linestyle=linestyle, marker=marker, color=colors[op], label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_title("causal" if causal else "non-causal")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    axes[0].set_ylabel("forward + backward time (ms)")
    fig.suptitle(f"AFT operators on CPU, B = {cfg.batch}, C = {cfg.channels}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_ops_report(
    results: Sequence[OpsResult],
    cfg: OpsBenchConfig,
    out_dir: str | Path,
    command: str,
    name: str = "ops_benchmark",
    load_at_start: str | None = None,
    wall_s: float | None = None,
) -> dict[str, Path]:
    """Write ``{name}.md``, ``{name}.png`` and ``{name}.json`` (the raw results) to ``out_dir``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    paths = {"md": out / f"{name}.md", "png": out / f"{name}.png", "json": out / f"{name}.json"}
    report = format_ops_report(results, cfg, info, command, load_at_start=load_at_start, wall_s=wall_s)
    paths["md"].write_text(report, encoding="utf-8")
    plot_ops(results, cfg, paths["png"])
    payload = {
        "command": command,
        "machine": info,
        "load_at_start": load_at_start,
        "wall_s": wall_s,
        "config": dataclasses.asdict(cfg),
        "results": [dataclasses.asdict(r) for r in results],
    }
    paths["json"].write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    for kind, path in paths.items():
        logger.info("wrote %s %s", kind, path)
    return paths


# ----------------------------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------------------------


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(",", " ").split())


def add_ops_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the ``ops`` subcommand."""
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, a smoke test (about a minute); writes ops_benchmark_quick.*"
    )
    parser.add_argument("--out", type=Path, default=Path("results"), help="output folder (default: results/)")
    parser.add_argument("--seq-lens", type=_int_list, default=None, help="comma-separated T values")
    parser.add_argument("--batch", type=int, default=None, help="batch size B")
    parser.add_argument("--channels", type=int, default=None, help="channels C")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (median reported)")
    parser.add_argument("--ops", type=lambda s: tuple(s.replace(",", " ").split()), default=None,
                        help=f"operators to measure, from {','.join(OPS)}")  # fmt: skip
    parser.add_argument("--time-budget", type=float, default=None, help="skip configurations estimated above this (s)")
    parser.add_argument("--no-reference", action="store_true", help="leave out the float64 loop references")
    parser.add_argument("--no-sdpa", action="store_true", help="leave out scaled_dot_product_attention")
    parser.add_argument("--no-aft-pytorch", action="store_true", help="leave out the aft-pytorch package")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _config_from_args(args: argparse.Namespace) -> OpsBenchConfig:
    overrides = {
        "seq_lens": args.seq_lens,
        "batch": args.batch,
        "channels": args.channels,
        "repeats": args.repeats,
        "ops": args.ops,
        "time_budget_s": args.time_budget,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    overrides.update(
        with_reference=not args.no_reference, with_sdpa=not args.no_sdpa, with_aft_pytorch=not args.no_aft_pytorch
    )
    return OpsBenchConfig.quick(**overrides) if args.quick else OpsBenchConfig(**overrides)


def run_ops_command(args: argparse.Namespace, command: str) -> dict[str, Path]:
    """Run the ``ops`` subcommand: measure, write the report and return the paths written (keys md, png, json)."""
    cfg = _config_from_args(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    logger.info("ops benchmark: %s", cfg)
    load, start = _load_average(), time.perf_counter()
    results = run_ops_benchmark(cfg, progress=not args.no_progress)
    name = "ops_benchmark_quick" if args.quick else "ops_benchmark"
    return write_ops_report(
        results, cfg, args.out, command, name=name, load_at_start=load, wall_s=time.perf_counter() - start
    )


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The benchmark command line, one subcommand per benchmark: ``ops`` here, ``models`` from
    :mod:`aft_hub.bench_models` when that module is present. Pass a parser to fill an existing (sub)command.

    Every subcommand sets ``run(args, command) -> dict[str, Path]`` (the report files written).
    """
    if parser is None:
        parser = argparse.ArgumentParser(description="Benchmarks of aft_hub.")
    subparsers = parser.add_subparsers(dest="benchmark", required=True)
    ops = subparsers.add_parser("ops", help="forward + backward time and peak memory of the AFT operators")
    add_ops_arguments(ops)
    ops.set_defaults(run=run_ops_command)
    try:
        from aft_hub import bench_models
    except ImportError as err:  # the models benchmark is optional
        logger.debug("no models benchmark: %s", err)
    else:
        models = subparsers.add_parser("models", help="model-level benchmarks: AFT models against Transformers")
        bench_models.add_models_arguments(models)
        models.set_defaults(run=bench_models.run_models_command)
    return parser


def run(argv: Sequence[str] | None = None, prog: str = "aft-hub bench") -> dict[str, Path]:
    """Parse ``argv`` (e.g. ``["ops", "--quick"]``; default ``sys.argv[1:]``), run the benchmark, return the paths
    of the report files written. ``prog`` is the program name shown in the help and recorded in the report."""
    import shlex
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argparse.ArgumentParser(prog=prog, description="Benchmarks of aft_hub."))
    args = parser.parse_args(argv)
    return args.run(args, command=shlex.join([*shlex.split(prog), *argv]))


def main(argv: Sequence[str] | None = None, prog: str = "aft-hub bench") -> int:
    """Entry point of ``aft-hub bench``: :func:`run`, then the exit status 0."""
    run(argv, prog)
    return 0
