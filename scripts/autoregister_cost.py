#!/usr/bin/env python
"""Measure what aft_hub's autoregistration costs: interpreter start-up, and the first import of timm / transformers.

Runs fresh interpreters alternately with and without ``AFT_HUB_NO_AUTOREGISTER=1`` and reports the median (and the
minimum) of their CPU time, like hyperfine but in CPU seconds of the child, which load on the machine disturbs less
than wall time. It also times the ``.pth`` line itself in-process (``python -S``, so nothing else is measured),
times the registration work (the import the hook performs, right after the import that triggers it), and lists
the modules the hook adds to a bare interpreter (``-X importtime`` cannot see code run from a ``.pth`` line). Use
the Python of an environment where aft_hub is installed (``pip install .`` or ``pip install -e .``)::

    python scripts/autoregister_cost.py --python .venv/bin/python --runs 30
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys

CASES = {
    "start-up (python -c pass)": "pass",
    "import timm": "import timm",
    "from transformers import AutoConfig": "from transformers import AutoConfig",
    "import timm; timm.create_model('aft_conv_small')": "import timm; timm.create_model('aft_conv_small')",
}


def _time(python: str, code: str, disabled: bool) -> float:
    """CPU seconds (user + system) of a fresh interpreter running ``code``: steadier than wall time on a busy
    machine, and the same thing when the machine is idle (start-up is single-threaded CPU work)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([python, "-c", code], env=_env(disabled), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _extra_modules(python: str) -> list[str]:
    """Modules in sys.modules at start-up with the hook that are not there without it."""
    code = "import sys; print(' '.join(sorted(sys.modules)))"
    on = subprocess.run([python, "-c", code], env=_env(False), capture_output=True, text=True, check=True).stdout
    off = subprocess.run([python, "-c", code], env=_env(True), capture_output=True, text=True, check=True).stdout
    return sorted(set(on.split()) - set(off.split()))


def _site_packages(python: str) -> str:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def _pth_line_seconds(python: str, site_packages: str) -> float:
    """In-process CPU time of executing the .pth line (finding aft_hub, loading the hook, installing the finder).

    ``python -S`` skips site-packages; the script then adds it by hand, runs aft_hub's editable finder line when
    there is one (as site would, first), and times the autoregistration line alone.
    """
    code = f"""
import glob, os, sys, time
sp = {site_packages!r}
sys.path.append(sp)
for name in sorted(glob.glob(os.path.join(sp, "__editable__*aft_hub*.pth"))):
    exec(open(name).read())
line = open(os.path.join(sp, "aft_hub_autoregister.pth")).read()
sitedir = sp  # what site.addpackage has in scope when it runs the line
start = time.process_time()
exec(line)
print(time.process_time() - start, type(sys.meta_path[0]).__name__)
"""
    out = subprocess.run([python, "-S", "-c", code], env=_env(False), capture_output=True, text=True, check=True)
    seconds, finder = out.stdout.split()
    assert finder == "AutoRegisterFinder", out.stdout
    return float(seconds)


def _registration_seconds(python: str, setup: str, target: str) -> float:
    """In-process CPU time of importing ``target`` (what the hook imports) right after ``setup`` (its trigger)."""
    code = f"import time; {setup}; t = time.process_time(); import {target}; print(time.process_time() - t)"
    out = subprocess.run([python, "-c", code], env=_env(True), capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def _env(disabled: bool) -> dict[str, str]:
    # bytecode caching on, as for users (an editable install otherwise recompiles the hook at every start-up)
    env = {k: v for k, v in os.environ.items() if k not in ("AFT_HUB_NO_AUTOREGISTER", "PYTHONDONTWRITEBYTECODE")}
    if disabled:
        env["AFT_HUB_NO_AUTOREGISTER"] = "1"
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter of an environment with aft_hub")
    parser.add_argument("--runs", type=int, default=20, help="runs per case and setting")
    parser.add_argument("--quick", action="store_true", help="start-up and registration work only")
    args = parser.parse_args(argv)
    print(f"python: {args.python}; {args.runs} runs per cell; median [min]\n")
    print(f"modules the hook adds at start-up: {_extra_modules(args.python) or 'none'}")
    site_packages = _site_packages(args.python)
    line = [_pth_line_seconds(args.python, site_packages) for _ in range(args.runs)]
    print(f"executing the .pth line (python -S, in-process): median {1e6 * statistics.median(line):.0f} us, "
          f"min {1e6 * min(line):.0f} us\n")  # fmt: skip
    print("registration work, in-process (what the hook imports, timed right after the import that triggers it):")
    for setup, target in (("import timm", "aft_hub.timm_models"),
                          ("from transformers import AutoModel", "aft_hub.hf")):  # fmt: skip
        times = [_registration_seconds(args.python, setup, target) for _ in range(max(3, args.runs // 2))]
        print(f"  after `{setup}`: import {target}: median {1e3 * statistics.median(times):.0f} ms, "
              f"min {1e3 * min(times):.0f} ms")  # fmt: skip
    print()
    print("CPU seconds of a fresh interpreter:\n")
    print("| case | hook on | hook off (AFT_HUB_NO_AUTOREGISTER=1) | difference |\n|---|---|---|---|")
    cases = dict(list(CASES.items())[:1]) if args.quick else CASES
    for label, code in cases.items():
        on, off = [], []
        if "create_model" in code:
            # without the hook the name is unknown: import aft_hub by hand, which is what the hook saves
            code_off = code.replace("import timm;", "import timm, aft_hub.timm_models;")
        else:
            code_off = code
        _time(args.python, code, False)  # warm the file cache
        for _ in range(args.runs):
            on.append(_time(args.python, code, False))
            off.append(_time(args.python, code_off, True))
        m_on, m_off = statistics.median(on), statistics.median(off)
        print(
            f"| `{label}` | {m_on:.3f} [{min(on):.3f}] | {m_off:.3f} [{min(off):.3f}] | "
            f"{1e3 * (m_on - m_off):+.1f} ms |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
