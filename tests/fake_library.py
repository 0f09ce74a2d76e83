"""A stand-in for the loaded libnattn (nattn/_cuda/library.py's Library) for CPU tests of the
cuda backend's Python side: the compiled kernel list, the families with attention dropout,
the TF32 rows and ABI, and a forward/backward that record the problem structs they receive."""

from nattn._cuda import kernel_table, library
from nattn.backends import BACKENDS, heuristics
from nattn.backends import cuda as cuda_backend

CUDA = BACKENDS["cuda"]


class FakeLibrary:
    """SIMT instances for every dtype at ``head_dims``; with ``tc`` the tensor-core family for
    fp16/bf16 up to head dim 128, and its float32 (TF32) rows at ``tf32_dims``; ``dropout``:
    the families with attention dropout (None: the library has no such list, as before ABI 3);
    ``abi``: the ABI it reports with its field count (None: neither attribute, nor a TF32
    table)."""

    def __init__(self, head_dims=(16, 32, 64, 128, 256), tc=False, tf32_dims=(), dropout=None, abi=None):
        self.path = "/fake/libnattn.so"
        if abi is not None:
            self.abi, self.num_fields = abi, kernel_table.ABI_PROBLEM_FIELDS[abi]
        self.kernels = {("simt", dt, nd): list(head_dims) for dt in kernel_table.DTYPES for nd in (1, 2, 3)}
        if tc:
            self.kernels.update({("tc", dt, nd): [16, 32, 64, 128] for dt in ("float16", "bfloat16") for nd in (1, 2, 3)})
        if tf32_dims:
            self.kernels.update({("tc", "float32", nd): list(tf32_dims) for nd in (1, 2, 3)})
        if abi is not None:
            self.tf32 = {nd: list(tf32_dims) for nd in (1, 2, 3)} if abi >= 4 and tf32_dims else {}
        if dropout is not None:
            self.dropout_families = set(dropout)
        self.calls = []

    def _record(self, fields, n, scale, stream, err, err_len):
        self.calls.append(list(fields)[:n])  # what the library reads
        return 0

    forward = backward = _record


def install(monkeypatch, lib):
    """Makes ``lib`` the loaded library for one test (the GPU arch check passes)."""
    monkeypatch.setitem(library._state, "lib", lib)
    monkeypatch.setitem(library._state, "tried", True)
    monkeypatch.setitem(library._state, "error", None)
    monkeypatch.setattr(CUDA, "_arch_ok", {0: None})


def install_on_gpu(monkeypatch, lib, capability=(8, 0)):
    """install, on a GPU of ``capability`` with a placeholder stream, no NATTN_FAMILY cap."""
    install(monkeypatch, lib)
    monkeypatch.setattr(heuristics, "_capability", lambda index: capability)
    monkeypatch.setattr(heuristics, "_capability_major", lambda index: capability[0])
    monkeypatch.setattr(cuda_backend, "_raw_stream", lambda device: 0)
    monkeypatch.delenv("NATTN_FAMILY", raising=False)
