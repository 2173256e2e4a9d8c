#!/usr/bin/env python
"""Benchmarks of aft_hub.

    python scripts/benchmark.py ops [--quick] [--out results/]
    python scripts/benchmark.py models [--quick]  (when aft_hub.bench_models is present)

``ops``: forward + backward time and peak CPU memory of the AFT operators against their float64 references,
scaled_dot_product_attention and the aft-pytorch package; writes results/ops_benchmark.{md,png,json}
(ops_benchmark_quick.* with --quick) and prints the Markdown report. The logic lives in :mod:`aft_hub.bench`
(also behind ``aft-hub bench``).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the profiler's C++ logger: errors about absent GPUs are noise here
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from aft_hub.bench import run  # noqa: E402

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    paths = run(prog="python scripts/benchmark.py")
    if isinstance(paths, dict) and "md" in paths:
        print(Path(paths["md"]).read_text(encoding="utf-8"))
