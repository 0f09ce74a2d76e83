"""Opt-in package metadata for the ``natten`` alias, for code that asks for a distribution.

Some callers test for NATTEN with ``importlib.metadata.version("natten")`` rather than an
import (``transformers``' ``is_natten_available()`` does, when ``transformers`` is imported).
:func:`install` adds a finder to ``sys.meta_path`` that answers only a lookup of the name
``natten`` (never a listing of all distributions), with version :data:`VERSION`: the NATTEN
release whose public API nattn.compat follows (0.14's op names and module signatures).
"""

from __future__ import annotations

import importlib.metadata as md
import sys

VERSION = "0.14.6"
_METADATA = f"Metadata-Version: 2.1\nName: natten\nVersion: {VERSION}\nSummary: nattn.compat alias\n"


class _AliasDistribution(md.Distribution):
    def read_text(self, filename):
        return _METADATA if filename in ("METADATA", "PKG-INFO") else None

    def locate_file(self, path):
        raise FileNotFoundError(f"the natten alias of nattn.compat has no files ({path})")


class _AliasFinder:
    """A meta-path finder that imports nothing and knows one distribution, ``natten``."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        return None

    @staticmethod
    def find_distributions(context=md.DistributionFinder.Context()):
        if context.name is not None and context.name.lower().replace("-", "_") == "natten":
            yield _AliasDistribution()


def install() -> None:
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AliasFinder)]
