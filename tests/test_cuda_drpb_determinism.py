"""The cuda backend under torch.use_deterministic_algorithms(True): an RPB gradient libnattn
sums in fixed point (a KV head's tables within the 48 KiB its kernels stage: 4 bytes an entry
on the tensor-core and Hopper families, 8 on SIMT) passes; a larger one, summed with float
atomics, raises torch's alert (a warning with warn_only), and warns for a call that asked for
the deterministic configuration (deterministic=True pins "dq=pass"). CPU only: a stand-in
library."""

import pytest
import torch

from nattn.backends import BACKENDS
from nattn.backends import cuda as cuda_backend
from nattn.params import normalize

import fake_library

CUDA = BACKENDS["cuda"]


@pytest.fixture
def lib(monkeypatch):
    lib = fake_library.FakeLibrary(tc=True)
    fake_library.install_on_gpu(monkeypatch, lib)
    yield lib
    torch.use_deterministic_algorithms(False)


def backward(kernel, dtype=torch.float16, heads=2, heads_kv=2, backend=CUDA):
    """One 2-D backward with an RPB of ``kernel`` (odd) through the stand-in library."""
    side = kernel + 2
    q = torch.randn(1, side, side, heads, 16, dtype=dtype)
    kv = torch.randn(1, side, side, heads_kv, 16, dtype=dtype)
    rpb = torch.randn(heads, 2 * kernel - 1, 2 * kernel - 1)
    params = normalize(q, kv, kv, 2, kernel, rpb=rpb)
    out, lse = backend.na_forward(q, kv, kv, rpb, params)
    return backend.na_backward(q, kv, kv, rpb, out, lse, out, None, params)


def test_tables_the_kernels_stage_pass(lib):
    torch.use_deterministic_algorithms(True)
    backward(55)  # 109 x 109 x 4 bytes = 47524: the largest 2-D window staged at one head a KV head
    backward(39, dtype=torch.float32)  # SIMT (float32 without TF32): 77 x 77 x 8 = 47432
    assert len(lib.calls) == 4


@pytest.mark.parametrize("kernel, dtype, heads", [(57, torch.float16, 2), (41, torch.float32, 2),
                                                  (39, torch.float16, 8)])
def test_float_atomics_raise_torchs_alert(lib, kernel, dtype, heads):
    """Above the bound (2-D 57x57 at 4 bytes, 41x41 at SIMT's 8, or GQA: 4 query heads a KV
    head multiply the tables) the alert fires before the library is called."""
    torch.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError, match="float atomics.*use_deterministic_algorithms"):
        backward(kernel, dtype, heads=heads, heads_kv=2)
    assert len(lib.calls) == 1  # the forward only
    torch.use_deterministic_algorithms(True, warn_only=True)
    with pytest.warns(UserWarning, match="float atomics"):
        backward(kernel, dtype, heads=heads, heads_kv=2)
    torch.use_deterministic_algorithms(False)
    backward(kernel, dtype, heads=heads, heads_kv=2)  # no alert without the switch


def test_simt_forced_counts_eight_bytes(lib, monkeypatch):
    """NATTN_FAMILY=simt runs float16 on SIMT too: its int64 tables bound the staged window."""
    torch.use_deterministic_algorithms(True)
    backward(41, torch.float16)
    monkeypatch.setenv("NATTN_FAMILY", "simt")
    with pytest.raises(RuntimeError, match="8 an entry"):
        backward(41, torch.float16)
    assert cuda_backend._DRPB_STAGE_BYTES == 48 * 1024


def test_deterministic_configuration_warns(lib, recwarn):
    """Without torch's switch, the pinned deterministic configuration warns about a float-atomic
    dRPB (and stays silent for a staged one)."""
    pinned = CUDA.configured("dq=pass")
    backward(55, backend=pinned)
    assert not [w for w in recwarn if "float atomics" in str(w.message)]
    with pytest.warns(UserWarning, match="asked for a deterministic backward"):
        backward(57, backend=pinned)
    backward(57)  # the default configuration: no promise, no warning (pytest.warns took the one above)
    assert not [w for w in recwarn if "float atomics" in str(w.message)]
