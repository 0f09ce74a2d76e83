"""libnattn's C ABI checks, on the CPU: the library validates a problem before touching
the GPU, so its error codes and messages are testable without one. Runs when a built
library is found (NATTN_LIBRARY, as .ci/compile_kernels.sh sets it); skipped otherwise."""

import ctypes

import pytest
import torch

from nattn._cuda import kernel_table, library
from nattn.backends import BACKENDS
from nattn.params import normalize

LIB = library.load()
pytestmark = pytest.mark.skipif(LIB is None, reason="libnattn is not built")
CUDA = BACKENDS["cuda"]


def call(fields, n=None, fn="forward"):
    err = ctypes.create_string_buffer(1024)
    rc = getattr(LIB, fn)(fields, len(fields) if n is None else n, 0.5, None, err, 1024)
    return rc, err.value.decode()


# A problem the library has a kernel for (CI builds a one-instance subset).
(_, DTYPE_NAME, NA_DIM), _DIMS = (sorted(LIB.kernels.items())[0] if LIB else ((None, "float32", 2), [32]))
DTYPE = getattr(torch, DTYPE_NAME)
DIM = min(_DIMS)
SPATIAL = (9, 11, 7)[:NA_DIM]
KERNEL = (3, 5, 2)[:NA_DIM]


def problem(dim=DIM, dim_v=DIM, offset=0):
    n = 2 * 2 * dim
    for s in SPATIAL:
        n *= s
    q = torch.zeros(n + 64, dtype=DTYPE)[offset : offset + n].view(2, *SPATIAL, 2, dim)
    v = torch.zeros(2, *SPATIAL, 2, dim_v, dtype=DTYPE)
    out = torch.empty(2, *SPATIAL, 2, dim_v, dtype=DTYPE)
    lse = torch.empty(2, *SPATIAL, 2)
    params = normalize(q, q, v, NA_DIM, KERNEL, dilation=(2,) + (1,) * (NA_DIM - 1))
    fields, _ = CUDA._pack(params, q, q, v, out, lse, None)
    return fields


def test_library_reports_its_table():
    assert LIB.kernels, "the library lists no kernels"
    for (family, dtype, na_dim), dims in LIB.kernels.items():
        assert family in ("simt", "tc", "sm90") and dtype in kernel_table.DTYPES and na_dim in (1, 2, 3)
        assert set(dims) <= set(kernel_table.HEAD_DIM_BUCKETS)


def test_wrong_field_count_is_refused():
    rc, msg = call(problem(), n=kernel_table.NUM_PROBLEM_FIELDS - 1)
    assert rc == 1 and "problem fields" in msg


def test_bad_head_dim_names_the_config():
    rc, msg = call(problem(dim_v=12))
    assert rc == 1 and "multiples of 8" in msg
    spatial = ",".join(str(x) for x in SPATIAL + (0,) * (3 - NA_DIM))
    kernel = ",".join(str(x) for x in KERNEL + (1,) * (3 - NA_DIM))
    assert f"dtype={DTYPE_NAME} na_dim={NA_DIM} batch=2 spatial=({spatial}) heads=2" in msg
    assert f"kernel=({kernel})" in msg and "dilation=(2,1,1)" in msg


def test_misaligned_pointer_is_refused():
    rc, msg = call(problem(offset=1))
    assert rc == 1 and "q is not 16-byte aligned" in msg


def test_head_dim_without_kernel():
    rc, msg = call(problem(dim=264, dim_v=264))
    assert rc == 2 and "no compiled SIMT kernel" in msg


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")
def test_valid_problem_without_gpu_reports_cuda_error():
    rc, msg = call(problem())
    assert rc == 3 and "nattn forward" in msg and "device" in msg


def test_backward_needs_its_buffers():
    rc, msg = call(problem(), fn="backward")
    assert rc == 1 and ("null" in msg)
