"""Opt-in: let ``import natten`` / ``import natten.functional`` resolve to :mod:`nattn.compat`.

Never automatic: call :func:`install_natten_alias` before the old code imports ``natten``.
"""

from __future__ import annotations

import sys

from . import alias_metadata

_NAMES = ("natten", "natten.functional")


def _ours():
    from . import functional
    return {"natten": sys.modules[__package__], "natten.functional": functional}


def install_natten_alias(replace: bool = False, metadata: bool = False) -> None:
    """Register ``natten`` and ``natten.functional`` in ``sys.modules`` as nattn.compat.

    Then ``from natten import NeighborhoodAttention2D`` and ``from natten.functional
    import natten2dqkrpb, natten2dav`` give the NATTEN 0.14-0.17 names of nattn.compat.

    Args:
        replace: if a real ``natten`` is already imported, replace it (True) or raise (False).
        metadata: also answer ``importlib.metadata.version("natten")`` (with ``"0.14.6"``,
            the API nattn.compat follows) for callers that look for an installed
            distribution, such as ``transformers``' ``is_natten_available()``; see
            :mod:`nattn.compat.alias_metadata`. A real installed ``natten`` distribution,
            where there is one, is found first.

    Raises:
        RuntimeError: another ``natten`` module is already imported and ``replace`` is False.
        TypeError: ``replace`` or ``metadata`` not a bool.
    """
    for arg, value in (("replace", replace), ("metadata", metadata)):
        if not isinstance(value, bool):
            raise TypeError(f"{arg} must be a bool, got {value!r}")
    ours = _ours()
    for name in _NAMES:
        present = sys.modules.get(name)
        if present is not None and present is not ours[name] and not replace:
            raise RuntimeError(
                f"module {name!r} is already imported ({getattr(present, '__file__', present)!r}); "
                "call install_natten_alias(replace=True) to shadow it with nattn.compat"
            )
    sys.modules.update(ours)
    if metadata:
        alias_metadata.install()


def uninstall_natten_alias() -> None:
    """Remove the aliases (only those that point at nattn.compat) and the metadata finder."""
    alias_metadata.uninstall()
    ours = _ours()
    for name in _NAMES:
        if sys.modules.get(name) is ours[name]:
            del sys.modules[name]
