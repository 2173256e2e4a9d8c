"""Remote code: self-contained copies of aft_hub's modules, so a published repo loads with ``trust_remote_code=True``
where aft_hub is not installed.

transformers copies the module named in ``config.json``'s ``auto_map`` plus every module it imports *relatively*
(``from .name import x``; only flat, single-level names) into its module cache, and refuses files whose absolute
imports are not installed. So the bundle is flat: each aft_hub module that the entry classes need, directly or
through others (``aft_hub.hf.modeling_aft`` -> ``aft_hub.layers.mixers`` -> ``aft_hub.ops.functional``...), is
copied verbatim with only its import statements rewritten: ``from ..layers import AftBlock`` becomes
``from .aft_layers_block import AftBlock``. Names imported from a package's ``__init__`` are traced to the submodule
that defines them, so ``aft_hub/__init__.py`` and the other front ends are never pulled in. The bundle is generated
at publish time from the installed package, so it is always the code the weights were saved with.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["PACKAGE", "bundle_remote_code", "flat_module_name", "collect_modules", "rewrite_imports"]

PACKAGE = "aft_hub"


@dataclasses.dataclass(frozen=True)
class _ModuleFile:
    name: str  # dotted module name, e.g. "aft_hub.ops.functional"
    path: Path
    is_package: bool

    @property
    def package(self) -> str:
        """The package that relative imports of this module start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


def _is_ours(name: str | None) -> bool:
    return name is not None and (name == PACKAGE or name.startswith(PACKAGE + "."))


def _module_file(name: str) -> _ModuleFile | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return _ModuleFile(name, Path(spec.origin), spec.submodule_search_locations is not None)


def _require_module(name: str) -> _ModuleFile:
    module = _module_file(name)
    if module is None:
        raise ValueError(f"Cannot bundle {name!r}: it is not a Python source module of {PACKAGE}.")
    return module


def flat_module_name(module: str) -> str:
    """File stem of ``module`` in the bundle: ``aft_hub.hf.modeling_aft`` -> ``modeling_aft`` (the transformers
    front end keeps its names, which ``auto_map`` refers to), ``aft_hub.ops.functional`` -> ``aft_ops_functional``."""
    if not _is_ours(module):
        raise ValueError(f"{module!r} is not a module of {PACKAGE}.")
    parts = module.split(".")[1:]
    if len(parts) >= 2 and parts[0] == "hf":
        return "_".join(parts[1:])
    return "_".join(["aft", *parts]) if parts else "aft_hub_init"


def _absolute(module: _ModuleFile, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.package.split(".")
    if node.level - 1 > len(base) - 1:
        raise ValueError(f"{module.path}: relative import beyond the top-level package at line {node.lineno}.")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


MODULE = "<module>"  # marks an import of a module object (``from . import _band``)


def _defining_module(package: str, attr: str, _seen: frozenset[tuple[str, str]] = frozenset()) -> tuple[str, str]:
    """Where ``from package import attr`` really finds ``attr``: ``(module, name there)``.

    A name re-exported by a package's ``__init__`` (``from .functional import aft_full``) is traced to the submodule
    that defines it, following chains of re-exports; anything else is defined by ``package`` itself. A submodule
    (``from . import _band``) gives ``(submodule, MODULE)``.
    """
    if (package, attr) in _seen:
        raise ValueError(f"Circular re-export of {attr!r} in {package}.")
    module = _require_module(package)
    if module.is_package and _module_file(f"{package}.{attr}") is not None:
        return f"{package}.{attr}", MODULE
    if not module.is_package:
        return package, attr
    tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == attr and alias.name != "*":
                    source = _absolute(module, node)
                    if _is_ours(source):
                        return _defining_module(source, alias.name, _seen | {(package, attr)})
    return package, attr


def _planned_imports(module: _ModuleFile, node: ast.ImportFrom) -> list[tuple[str, list[ast.alias]]] | None:
    """For an import of our package: ``[(defining module, [aliases with the names there]), ...]``; else None.

    An imported module object is an alias named :data:`MODULE` (bound to ``asname``).
    """
    source = _absolute(module, node)
    if not _is_ours(source):
        return None
    groups: dict[str, list[ast.alias]] = {}
    for alias in node.names:
        if alias.name == "*":
            raise ValueError(f"{module.path}:{node.lineno}: `from {source} import *` cannot be bundled.")
        target, name = _defining_module(source, alias.name)
        asname = alias.asname or (alias.name if name != alias.name else None)
        groups.setdefault(target, []).append(ast.alias(name=name, asname=asname))
    return list(groups.items())


def _imports_of(module: _ModuleFile) -> tuple[ast.Module, list[tuple[ast.ImportFrom, list[tuple[str, list]]]]]:
    tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_ours(alias.name):
                    raise ValueError(
                        f"{module.path}:{node.lineno}: `import {alias.name}` cannot be bundled; use "
                        f"`from ... import name`."
                    )
        elif isinstance(node, ast.ImportFrom):
            plan = _planned_imports(module, node)
            if plan is not None:
                found.append((node, plan))
    return tree, found


def collect_modules(entries: Iterable[str]) -> list[str]:
    """Every module of aft_hub that ``entries`` need, entries first, then in discovery order."""
    order: list[str] = []
    todo = list(entries)
    while todo:
        name = todo.pop(0)
        if name in order:
            continue
        if not _is_ours(name):
            raise ValueError(f"{name!r} is not a module of {PACKAGE}.")
        order.append(name)
        _, found = _imports_of(_require_module(name))
        for _, plan in found:
            todo.extend(target for target, _ in plan if target not in order)
    return order


def _render_import(target: str, aliases: list[ast.alias], indent: str) -> str:
    flat = flat_module_name(target)
    modules = [a for a in aliases if a.name == MODULE]
    lines = []
    if modules:
        # transformers finds the files to copy by `from .name import` lines only, so name the file that way first
        lines.append(f"from .{flat} import __name__ as _{flat}_name  # (lets transformers copy {flat}.py)")
        lines += [f"from . import {flat} as {a.asname}" for a in modules]
    aliases = [a for a in aliases if a.name != MODULE]
    if aliases:
        lines.append(_render_names(flat, aliases, indent))
    return ("\n" + indent).join(lines)


def _render_names(flat: str, aliases: list[ast.alias], indent: str) -> str:
    names = [a.name if not a.asname else f"{a.name} as {a.asname}" for a in aliases]
    line = f"from .{flat} import {', '.join(names)}"
    if len(indent) + len(line) <= 119:
        return line
    body = "".join(f"{indent}    {name},\n" for name in names)
    return f"from .{flat} import (\n{body}{indent})"


def rewrite_imports(module_name: str) -> str:
    """The source of ``module_name`` with every import of aft_hub rewritten to a flat relative import."""
    module = _require_module(module_name)
    raw = module.path.read_bytes()
    _, found = _imports_of(module)
    lines = raw.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    edits = []
    for node, plan in found:
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        prefix = raw[starts[node.lineno - 1] : begin]
        if prefix.strip():
            raise ValueError(f"{module.path}:{node.lineno}: put the import of aft_hub on a line of its own.")
        indent = prefix.decode()
        text = ("\n" + indent).join(_render_import(target, aliases, indent) for target, aliases in plan)
        edits.append((begin, end, text.encode()))
    out = raw
    for begin, end, text in sorted(edits, reverse=True):
        out = out[:begin] + text + out[end:]
    return out.decode("utf-8")


def _check_bundle(files: Mapping[str, str]) -> None:
    """Every relative import resolves to a bundled file and no file imports aft_hub absolutely."""
    stems = {name[:-3] for name in files}
    for name, source in files.items():
        for node in ast.walk(ast.parse(source, filename=name)):
            if isinstance(node, ast.ImportFrom):
                if node.level == 0 and _is_ours(node.module):
                    raise AssertionError(f"{name} still imports {node.module}")
                targets = [node.module] if node.module else [alias.name for alias in node.names]
                if node.level > 0 and (node.level != 1 or not set(targets) <= stems):
                    raise AssertionError(f"{name}:{node.lineno} has an unbundled relative import {targets}")
            elif isinstance(node, ast.Import) and any(_is_ours(a.name) for a in node.names):
                raise AssertionError(f"{name} still imports {PACKAGE}")


def bundle_remote_code(folder: str | Path, classes: Mapping[str, type]) -> dict[str, str]:
    """Write the code that ``classes`` need into ``folder`` and return the ``auto_map`` that points at it.

    Args:
        folder: the repo folder (next to ``config.json``).
        classes: Auto class name -> class of aft_hub, e.g. ``{"AutoConfig": AftConfig, "AutoModelForCausalLM":
            AftForCausalLM}``.

    Returns:
        The ``auto_map`` for ``config.json``, e.g. ``{"AutoConfig": "configuration_aft.AftConfig", ...}``.
    """
    from .. import __version__

    folder = Path(folder)
    auto_map: dict[str, str] = {}
    for auto_name, cls in classes.items():
        if not _is_ours(cls.__module__):
            raise ValueError(f"{auto_name}: {cls.__module__}.{cls.__qualname__} is not a class of {PACKAGE}.")
        auto_map[auto_name] = f"{flat_module_name(cls.__module__)}.{cls.__qualname__}"
    modules = collect_modules(dict.fromkeys(cls.__module__ for cls in classes.values()))
    files: dict[str, str] = {}
    for name in modules:
        file_name = flat_module_name(name) + ".py"
        if file_name in files:
            raise ValueError(f"Two modules map to the bundled file {file_name}; rename one of them.")
        source_path = _require_module(name).path
        relative = f"{PACKAGE}/" + source_path.relative_to(_require_module(PACKAGE).path.parent).as_posix()
        header = (
            f"# Generated by aft_hub {__version__} from {relative} so that this repository loads with\n"
            f"# `trust_remote_code=True` where aft_hub is not installed. Edit aft_hub, not this copy.\n"
        )
        files[file_name] = header + rewrite_imports(name)
    _check_bundle(files)
    folder.mkdir(parents=True, exist_ok=True)
    for file_name, source in files.items():
        (folder / file_name).write_text(source, encoding="utf-8")
    logger.info("Bundled %d modules for trust_remote_code: %s", len(files), ", ".join(files))
    return auto_map
