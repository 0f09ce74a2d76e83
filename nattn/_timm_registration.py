"""Register nattn's models with timm when timm is imported, not when nattn is.

Importing timm costs about a second (it pulls in torchvision); code that only calls
``nattn.na2d`` should not pay for it. So ``import nattn`` registers the models at once only
when timm is already imported, and otherwise arranges for them to be registered right after
timm's own import finishes: ``import nattn; import timm; timm.create_model("dinat_tiny")``
works in either order. Importing ``nattn.models`` directly registers them too.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings


def _register() -> None:
    try:
        from . import models  # noqa: F401  (registration happens at import)
    except ImportError as e:  # a broken timm/torchvision install must not break nattn itself
        warnings.warn(f"nattn.models were not registered with timm: {e}", ImportWarning, stacklevel=3)


class _AfterTimmImport(importlib.abc.MetaPathFinder):
    """Finds timm the usual way, then runs :func:`_register` once timm's module has executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "timm":
            return None
        sys.meta_path.remove(self)  # one shot; the lookup below must not find us again
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            _register()

        spec.loader.exec_module = exec_module
        return spec


def register_with_timm() -> None:
    """Register now if timm is imported, else when it is; nothing when timm is not installed."""
    if "timm" in sys.modules:
        _register()
    elif importlib.util.find_spec("timm") is not None:
        if not any(isinstance(f, _AfterTimmImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterTimmImport())
