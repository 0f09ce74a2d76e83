"""Test-only backends registered for one test or module: ``temporarily_registered(backend)``
adds it to nattn's registry and automatic order and restores both afterwards (and forgets
the calls chosen meanwhile), so it never joins a later test's automatic dispatch."""

import contextlib

from nattn import _call_cache, backends


@contextlib.contextmanager
def temporarily_registered(backend):
    saved = dict(backends.BACKENDS), list(backends.AUTO_ORDER)
    backends.register_backend(backend)
    try:
        yield backend.name
    finally:
        backends.BACKENDS.clear()
        backends.BACKENDS.update(saved[0])
        backends.AUTO_ORDER[:] = saved[1]
        _call_cache.clear()  # choices made while it was registered


def registry_state():
    """What a test must leave as it found it: the registered names and the automatic order."""
    return sorted(backends.BACKENDS), list(backends.AUTO_ORDER)
