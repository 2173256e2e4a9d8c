"""Run timm's own model test-suite (tests/test_models.py of timm's source distribution) on aft_hub's models.

``scripts/timm_conformance.sh`` copies this file next to a copy of timm's test file (with ``timm_models``, the
registry module of our models, added to its forward-intermediates module list) and runs it. timm's file builds
its parametrisations from ``timm.list_models()`` at import time, so the models are registered here, before it is
imported; only the items for our models (``aft_*``, ``test_aft_*``) are kept, the rest is deselected.

In aft_hub's own test run this file is inert: it only acts on items of a ``test_models.py`` next to it.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import timm

import aft_hub.timm_models  # noqa: F401  (registers the aft_* models with timm)

OUR_MODELS = ("aft_*", "test_aft_*")
_HERE = Path(__file__).resolve().parent


def _model_name(item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    name = callspec.params.get("model_name")
    return name if isinstance(name, str) else None


def pytest_collection_modifyitems(config, items):
    ours = set(timm.list_models(list(OUR_MODELS)))
    keep, drop = [], []
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if path.name != "test_models.py" or path.parent != _HERE:
            keep.append(item)
            continue
        name = _model_name(item)
        base = name.split(".")[0] if name else None
        if base in ours or (base and any(fnmatch.fnmatch(base, p) for p in OUR_MODELS)):
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
