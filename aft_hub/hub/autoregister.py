"""Autoregistration: make ``timm.create_model('aft_...')`` and ``AutoModel.from_pretrained(<aft repo>)`` work in a
fresh interpreter without ``import aft_hub``.

timm has no plugin discovery and transformers only knows the model types it ships, so a third-party model exists for
them only once the module holding its registrations has been imported. Installing aft_hub places
``aft_hub_autoregister.pth`` in site-packages; Python's :mod:`site` runs its single line at start-up. That line
loads *this file* by its path (it does not import ``aft_hub``, torch or anything else heavy) and calls
:func:`install`, which puts one small finder at the front of :data:`sys.meta_path`. The finder returns ``None`` at
once for every module outside ``timm``, ``transformers`` and ``aft_hub``; for those it wraps the loader to learn
when a module has finished executing:

* when ``timm`` has been imported, ``aft_hub.timm_models`` is imported (its ``@register_model`` functions run;
  timm has already imported torch, so this costs milliseconds);
* when ``transformers.models.auto.configuration_auto`` (behind ``AutoConfig``, every ``AutoModel*``, ``pipeline``)
  has been imported, nothing is imported yet: transformers' ``CONFIG_MAPPING`` learns to import ``aft_hub.hf``
  (which registers the configurations and models with the Auto classes) the first time anyone looks up the model
  type ``"aft"`` or ``"aft_vision"`` in it, as ``AutoConfig.from_pretrained`` does. So a program that uses
  transformers for other models pays nothing. Should that mapping ever change shape, ``aft_hub.hf`` is imported
  right away instead.

Registration waits until no module of those three packages is still executing, so it never sees a partially
initialised module. A failure is logged as a warning and never breaks the user's import. The wrapper loader puts
the original loader back on the module before running it, so ``module.__loader__`` and ``module.__spec__.loader``
are the real ones afterwards.

``AFT_HUB_NO_AUTOREGISTER=1`` (any value but ``""``, ``0``, ``false``, ``no``, ``off``) disables everything: the
``.pth`` line then does not even load this file.

At start-up this module and the ``.pth`` line import nothing that a bare interpreter has not loaded already (``sys``,
``os``, the built-in ``_thread`` and the frozen import machinery; no ``from __future__``, no ``importlib.util``), so
their cost is the execution of this file from its cached bytecode. ``scripts/autoregister_cost.py`` measures it.
"""

import _thread
import os
import sys

__all__ = ["ENV_VAR", "PTH_NAME", "TARGETS", "install", "uninstall", "is_disabled", "is_installed", "pth_line"]

ENV_VAR = "AFT_HUB_NO_AUTOREGISTER"
PTH_NAME = "aft_hub_autoregister.pth"

# front end -> modules whose import registers it
TARGETS: dict[str, tuple[str, ...]] = {
    "timm": ("aft_hub.timm_models",),
    "transformers": ("aft_hub.hf",),
}

_WATCHED = frozenset({"timm", "transformers", "aft_hub"})
_CONFIG_AUTO = "transformers.models.auto.configuration_auto"
MODEL_TYPES = ("aft", "aft_vision")  # the transformers model types aft_hub.hf registers


def is_disabled(environ: dict[str, str] | None = None) -> bool:
    """Whether ``AFT_HUB_NO_AUTOREGISTER`` turns autoregistration off."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def _front_end_of(name: str) -> str | None:
    """The front end whose registration the completed import of module ``name`` calls for."""
    return "timm" if name == "timm" else None


def _make_lazy_mapping_class(base: type, finder: "AutoRegisterFinder") -> type:
    """A subclass of transformers' ``_LazyConfigMapping`` that registers aft_hub before answering for its types."""

    class AftHubLazyConfigMapping(base):
        aft_hub_lazy = True

        def __getitem__(self, key):
            if key in MODEL_TYPES:
                finder.schedule("transformers")
            return super().__getitem__(key)

        def __contains__(self, key) -> bool:
            if key in MODEL_TYPES:
                finder.schedule("transformers")
            return super().__contains__(key)

        def __reduce__(self):  # pickles as the original class
            return (base._from_pickle, (dict(self._mapping), dict(self._extra_content)))

    return AftHubLazyConfigMapping


class _State(_thread._local):
    depth = 0  # modules of the watched packages executing in this thread
    running = False  # registration in progress in this thread


class _WrappedLoader:
    """Delegates to the real loader; tells the finder when the module has finished executing."""

    def __init__(self, finder: "AutoRegisterFinder", loader, name: str) -> None:
        self._finder = finder
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module) -> None:
        # leave no trace: code inspecting the module later sees the real loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        self._finder._enter()
        ok = False
        try:
            self._loader.exec_module(module)
            ok = True
        finally:
            self._finder._leave(self._name, ok)

    def __getattr__(self, item: str):
        return getattr(self._loader, item)


class AutoRegisterFinder:
    """A :data:`sys.meta_path` entry that registers aft_hub's models once timm / transformers' Auto classes load."""

    aft_hub_autoregister = True  # marker, so that install() stays idempotent across module copies

    def __init__(self) -> None:
        self._state = _State()
        self._lock = _thread.RLock()
        self.pending: set[str] = set()
        self.done: set[str] = set()
        self.errors: dict[str, str] = {}

    # -- importlib protocol ------------------------------------------------------------------------------------

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname.partition(".")[0] not in _WATCHED:
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is self or getattr(finder, "aft_hub_autoregister", False):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _WrappedLoader(self, spec.loader, fullname)
        return spec

    def invalidate_caches(self) -> None:
        pass

    # -- bookkeeping -------------------------------------------------------------------------------------------

    def _enter(self) -> None:
        self._state.depth += 1

    def _leave(self, name: str, ok: bool) -> None:
        state = self._state
        state.depth -= 1
        front_end = _front_end_of(name) if ok else None
        if ok and name == _CONFIG_AUTO and not self.make_config_mapping_lazy(sys.modules.get(name)):
            front_end = "transformers"
        if front_end is not None and front_end not in self.done:
            with self._lock:
                self.pending.add(front_end)
        if state.depth == 0 and not state.running and self.pending:
            self.register_pending()

    def make_config_mapping_lazy(self, module) -> bool:
        """Make ``CONFIG_MAPPING`` of ``module`` register aft_hub on the first lookup of an AFT model type.

        Returns False (the caller then registers at once) when the mapping is not the class this expects.
        """
        mapping = getattr(module, "CONFIG_MAPPING", None)
        base = type(mapping)
        if getattr(base, "aft_hub_lazy", False):
            return True
        if mapping is None or base.__name__ != "_LazyConfigMapping" or not hasattr(base, "_from_pickle"):
            return False
        try:
            mapping.__class__ = _make_lazy_mapping_class(base, self)
        except TypeError:
            return False
        return True

    def schedule(self, front_end: str) -> None:
        """Ask for the registration of ``front_end`` (``"timm"`` or ``"transformers"``) at the next safe point."""
        if front_end not in TARGETS:
            raise ValueError(f"Unknown front end {front_end!r}; expected one of {sorted(TARGETS)}.")
        with self._lock:
            if front_end not in self.done:
                self.pending.add(front_end)
        if self._state.depth == 0 and not self._state.running:
            self.register_pending()

    def register_pending(self) -> None:
        """Import the registering modules of every pending front end (never raises)."""
        state = self._state
        state.running = True
        try:
            while True:
                with self._lock:
                    todo = sorted(self.pending - self.done)
                    self.pending.clear()
                    self.done.update(todo)
                if not todo:
                    return
                import importlib

                for front_end in todo:
                    for module_name in TARGETS[front_end]:
                        try:
                            importlib.import_module(module_name)
                        except Exception as exc:  # never break the user's import of timm / transformers
                            self.errors[module_name] = f"{type(exc).__name__}: {exc}"
                            import logging

                            logging.getLogger("aft_hub.autoregister").warning(
                                "aft_hub could not register its %s models (%s: %s); import %s yourself, or set "
                                "%s=1 to turn autoregistration off.",
                                front_end,
                                type(exc).__name__,
                                exc,
                                module_name,
                                ENV_VAR,
                            )
        finally:
            state.running = False


def _installed_finder() -> AutoRegisterFinder | None:
    for finder in sys.meta_path:
        if getattr(finder, "aft_hub_autoregister", False):
            return finder
    return None


def is_installed() -> bool:
    """Whether an autoregistration finder is on :data:`sys.meta_path`."""
    return _installed_finder() is not None


def install() -> AutoRegisterFinder | None:
    """Put the finder at the front of :data:`sys.meta_path` (idempotent); ``None`` when disabled by the env var.

    Front ends whose trigger module is already imported are registered at once.
    """
    if is_disabled():
        return None
    finder = _installed_finder()
    if finder is None:
        finder = AutoRegisterFinder()
        sys.meta_path.insert(0, finder)
    if "timm" in sys.modules:
        finder.schedule("timm")
    if _CONFIG_AUTO in sys.modules and not finder.make_config_mapping_lazy(sys.modules[_CONFIG_AUTO]):
        finder.schedule("transformers")
    return finder


def uninstall() -> None:
    """Remove the finder(s) from :data:`sys.meta_path` and restore transformers' ``CONFIG_MAPPING`` class
    (registrations already made stay)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "aft_hub_autoregister", False)]
    mapping = getattr(sys.modules.get(_CONFIG_AUTO), "CONFIG_MAPPING", None)
    if getattr(type(mapping), "aft_hub_lazy", False):
        mapping.__class__ = type(mapping).__bases__[0]


# The code run by the one line of ``aft_hub_autoregister.pth`` (see :func:`pth_line`). It finds the installed
# aft_hub package without importing it and loads this file under the name ``aft_hub_autoregister``.
_BOOTSTRAP = """\
def _aft_hub_autoregister(sitedir=None):
    import os
    import sys

    if os.environ.get("AFT_HUB_NO_AUTOREGISTER", "").strip().lower() not in ("", "0", "false", "no", "off"):
        return
    try:
        try:  # the frozen import machinery is loaded already; importlib.util would pull in a dozen modules
            from _frozen_importlib import module_from_spec
            from _frozen_importlib_external import PathFinder, spec_from_file_location
        except ImportError:
            from importlib.machinery import PathFinder
            from importlib.util import module_from_spec, spec_from_file_location

        # a regular install: aft_hub sits next to this .pth file (site passes the directory as `sitedir`)
        path = os.path.join(sitedir, "aft_hub", "hub", "autoregister.py") if isinstance(sitedir, str) else ""
        if not os.path.isfile(path):
            # an editable install: ask the finders (setuptools' editable finder is on sys.meta_path by now), the
            # path finder last as it would list every directory of sys.path
            package = None
            for finder in sorted(sys.meta_path, key=lambda finder: finder is PathFinder):
                find = getattr(finder, "find_spec", None)
                package = find("aft_hub", None) if find is not None else None
                if package is not None:
                    break
            if package is None or not package.submodule_search_locations:
                return
            path = os.path.join(list(package.submodule_search_locations)[0], "hub", "autoregister.py")
            if not os.path.isfile(path):
                return
        spec = spec_from_file_location("aft_hub_autoregister", path)
        module = module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        module.install()
    except Exception as exc:
        sys.stderr.write(f"aft_hub: autoregistration is off ({type(exc).__name__}: {exc})\\n")


_aft_hub_autoregister(locals().get("sitedir"))
del _aft_hub_autoregister
"""


def pth_line() -> str:
    """The content of ``aft_hub_autoregister.pth``: one ``import`` line that :mod:`site` executes at start-up."""
    return f"import sys; exec({_BOOTSTRAP!r})\n"
