"""The ``aft-hub`` command line: thin subcommands over the package's public API."""

from __future__ import annotations

import argparse
import logging
import sys
import time

__all__ = ["main"]


def _cmd_demo(args: argparse.Namespace) -> int:
    """A short end-to-end demonstration of the operators and modules."""
    import torch

    from . import ops
    from .layers import AftBlock, AftConv, AftLocal

    torch.manual_seed(0)
    B, T, C = 2, 24, 16
    q, k, v = (torch.randn(B, T, C) for _ in range(3))
    w = torch.randn(T, T)
    print("AFT operators against their float64 loop references (max abs error):")
    for causal in (False, True):
        checks = {
            "aft_simple": (ops.aft_simple(q, k, v, causal=causal), ops.aft_simple_reference(q, k, v, causal=causal)),
            "aft_full": (ops.aft_full(q, k, v, w, causal=causal), ops.aft_full_reference(q, k, v, w, causal=causal)),
            "aft_local(s=4)": (
                ops.aft_local(q, k, v, w, 4, causal=causal),
                ops.aft_local_reference(q, k, v, w, 4, causal=causal),
            ),
        }
        for name, (fast, ref) in checks.items():
            print(f"  {name:<16} causal={causal!s:<5} {(fast.double() - ref.double()).abs().max().item():.2e}")
    # keys far apart in magnitude: a single global maximum would underflow, the running maximum does not
    k_big = torch.linspace(-1000, 1000, T).view(1, T, 1).expand(B, T, C).contiguous()
    y = ops.aft_simple(q, k_big, v, causal=True)
    err = (y.double() - ops.aft_simple_reference(q, k_big, v, causal=True).double()).abs().max().item()
    print(f"  keys from -1000 to 1000, causal aft_simple: finite={bool(torch.isfinite(y).all())} error={err:.2e}")

    print("AFT blocks (forward + backward):")
    x = torch.randn(4, 14 * 14, 192)
    for name, mixer in (("AFT-conv h=32 s=11", AftConv(192, 32, 11)), ("AFT-local s=7", AftLocal(192, 196, 7))):
        block = AftBlock(192, mixer)
        t0 = time.perf_counter()
        out = block(x, hw=(14, 14))
        out.square().mean().backward()
        n = sum(p.numel() for p in block.parameters())
        print(f"  {name:<20} params={n:>8,d} out={tuple(out.shape)} {1e3 * (time.perf_counter() - t0):.0f} ms")
    return 0


def _cmd_main(args: argparse.Namespace) -> int:
    from .main_job import run

    run(args)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    return bench.main(args.bench_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aft-hub", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="short end-to-end demonstration of the operators and modules")
    p.set_defaults(func=_cmd_demo)
    p = sub.add_parser("bench", help="benchmarks (same as scripts/benchmark.py)", add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_bench)
    p = sub.add_parser("main", help="the main job: train, publish, reload (LM and vision)")
    from .main_job import add_arguments as main_arguments

    main_arguments(p)
    p.set_defaults(func=_cmd_main)
    from .convert.cli import register as register_convert
    from .hub.cli import register as register_publish
    from .train.cli import register as register_train

    register_publish(sub)
    register_convert(sub)
    register_train(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
