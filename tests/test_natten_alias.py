"""nattn.compat.install_natten_alias: opt-in `import natten` -> nattn.compat, never automatic."""

import os
import subprocess
import sys

import pytest

import nattn
from nattn import compat

_ALIAS_SCRIPT = r"""
import sys
import nattn, nattn.compat
assert "natten" not in sys.modules, "import nattn must not register natten"
try:
    from natten.functional import natten2dqkrpb, natten2dav
except ImportError:
    pass
else:
    raise SystemExit("natten importable before install_natten_alias(): " + repr(natten2dqkrpb))
nattn.compat.install_natten_alias()
import natten
from natten.functional import natten2dqkrpb, natten2dav
from natten import NeighborhoodAttention2D
assert natten2dqkrpb is nattn.compat.natten2dqkrpb and natten2dav is nattn.compat.natten2dav
assert NeighborhoodAttention2D is nattn.compat.NeighborhoodAttention2D
import torch
q, k, v = (torch.randn(1, 2, 8, 8, 4, dtype=torch.float64) for _ in range(3))
rpb = torch.randn(2, 5, 5, dtype=torch.float64)
out = natten2dav(natten2dqkrpb(q * 0.5, k, rpb, 3, 2).softmax(-1), v, 3, 2)
ref = nattn.na2d(*(t.movedim(1, -2) for t in (q, k, v)), 3, dilation=2, scale=0.5, rpb=rpb).movedim(-2, 1)
torch.testing.assert_close(out, ref)
nattn.compat.uninstall_natten_alias()
assert "natten" not in sys.modules and "natten.functional" not in sys.modules
print("alias-ok")
"""


def test_natten_alias_is_opt_in_and_resolves_old_imports():
    root = os.path.dirname(os.path.dirname(nattn.__file__))  # this checkout's nattn, in the child too
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", _ALIAS_SCRIPT], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-1000:]
    assert res.stdout.strip().endswith("alias-ok")


def test_natten_alias_refuses_to_shadow_an_imported_natten(monkeypatch):
    import types
    fake = types.ModuleType("natten")
    monkeypatch.setitem(sys.modules, "natten", fake)
    with pytest.raises(RuntimeError, match="replace=True"):
        compat.install_natten_alias()
    assert sys.modules["natten"] is fake
    compat.install_natten_alias(replace=True)
    try:
        assert sys.modules["natten"] is compat
    finally:
        compat.uninstall_natten_alias()
    assert "natten" not in sys.modules and "natten.functional" not in sys.modules


_METADATA_SCRIPT = r"""
import importlib.metadata as md, importlib.util, sys
import nattn.compat

def available():  # what transformers' _is_package_available("natten") looks at
    if importlib.util.find_spec("natten") is None:
        return None
    try:
        return md.version("natten")
    except md.PackageNotFoundError:
        return "no-metadata"

assert available() is None, available()
nattn.compat.install_natten_alias()
assert available() == "no-metadata", available()  # metadata only on request
nattn.compat.install_natten_alias(metadata=True)
nattn.compat.install_natten_alias(metadata=True)  # idempotent
assert available() == "0.14.6", available()
assert sum(d.metadata["Name"] == "natten" for d in md.distributions()) == 0  # not in listings
assert sum(type(f).__name__ == "_AliasFinder" for f in sys.meta_path) == 1
nattn.compat.uninstall_natten_alias()
assert available() is None, available()
print("metadata-ok")
"""


def test_natten_alias_metadata_is_opt_in_and_removable():
    root = os.path.dirname(os.path.dirname(nattn.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", _METADATA_SCRIPT], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-1000:]
    assert res.stdout.strip().endswith("metadata-ok")


def test_natten_alias_arguments_are_checked():
    with pytest.raises(TypeError, match="metadata must be a bool"):
        compat.install_natten_alias(metadata="yes")
    with pytest.raises(TypeError, match="replace must be a bool"):
        compat.install_natten_alias(replace=1)
    assert "natten" not in sys.modules
