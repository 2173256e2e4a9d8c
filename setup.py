"""Build hook of aft_hub; all metadata lives in pyproject.toml.

``build_py`` additionally writes two things into the wheel:

* ``aft_hub_autoregister.pth`` at the wheel root (so in site-packages), whose single line lets a fresh interpreter
  find aft_hub's models after ``import timm`` / transformers' Auto classes without ``import aft_hub`` (see
  ``aft_hub/hub/autoregister.py``; ``AFT_HUB_NO_AUTOREGISTER=1`` turns it off). This holds for ``pip install .``
  and for ``pip install -e .`` (an editable wheel ships only what is put into its root, so the file goes there);
* the model-card templates of ``model_cards/`` as ``aft_hub/hub/model_cards/`` (regular installs only: an editable
  install reads them from the source tree).

Nothing here imports aft_hub (the build environment has no torch): the ``.pth`` line comes from
``aft_hub/hub/autoregister.py``, which uses the standard library only and is loaded by its path.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _autoregister_module():
    spec = importlib.util.spec_from_file_location("_aft_hub_autoregister_build", ROOT / "aft_hub/hub/autoregister.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithAutoregister(build_py):
    """``build_py`` that also writes ``aft_hub_autoregister.pth`` and copies the model-card templates."""

    def _extra_outputs(self) -> list[str]:
        if getattr(self, "editable_mode", False):
            return []
        autoregister = _autoregister_module()
        templates = Path(self.build_lib, "aft_hub", "hub", "model_cards")
        return [str(Path(self.build_lib, autoregister.PTH_NAME))] + [
            str(templates / path.name) for path in sorted((ROOT / "model_cards").glob("*.md"))
        ]

    def run(self) -> None:
        super().run()
        autoregister = _autoregister_module()
        if getattr(self, "editable_mode", False):
            # editable_wheel points install_lib at the unpacked wheel's root; build_lib is a throw-away directory
            root = Path(self.get_finalized_command("install").install_lib)
        else:
            root = Path(self.build_lib)
            templates = root / "aft_hub" / "hub" / "model_cards"
            templates.mkdir(parents=True, exist_ok=True)
            for path in sorted((ROOT / "model_cards").glob("*.md")):
                shutil.copyfile(path, templates / path.name)
        root.mkdir(parents=True, exist_ok=True)
        (root / autoregister.PTH_NAME).write_text(autoregister.pth_line(), encoding="utf-8")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return super().get_outputs(include_bytecode) + self._extra_outputs()


setup(cmdclass={"build_py": BuildPyWithAutoregister})
