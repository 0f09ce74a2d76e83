"""Find and load libnattn with ctypes; nothing here imports torch.

The library is looked for at ``$NATTN_LIBRARY`` (a path to a .so), then next to this
file (where setup.py installs it). :func:`load` returns None when it is absent or
cannot be opened; :func:`load_error` says why.
"""

from __future__ import annotations

import ctypes
import os
from typing import Optional

from . import kernel_table

LIBRARY_NAME = "libnattn.so"
_state = {"lib": None, "tried": False, "error": None}


def library_path() -> Optional[str]:
    """Path of the library this process would load, or None when there is none."""
    env = os.environ.get("NATTN_LIBRARY")
    if env:
        return env if os.path.isfile(env) else None
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)
    return here if os.path.isfile(here) else None


_NA_DIMS = [(n,) for n in (1, 2, 3)]
_NA_HEAD_DIMS = [(n, d) for n in (1, 2, 3) for d in (32, 64, 128, 256)]


def _int_table(lib, name: str, args: list) -> dict:
    """``{args: lib.name(*args)}`` for an int64 export taking int64s (single arguments keyed
    bare); empty when this build has no such export."""
    if not hasattr(lib, name):
        return {}
    fn = getattr(lib, name)
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64] * len(args[0])
    return {(a[0] if len(a) == 1 else a): fn(*a) for a in args}


class Library:
    """The loaded library with typed entry points and its compiled kernel list."""

    def __init__(self, path: str):
        self.path = path
        lib = ctypes.CDLL(path)
        self._lib = lib
        lib.nattn_abi_version.restype = ctypes.c_int64
        lib.nattn_num_problem_fields.restype = ctypes.c_int64
        lib.nattn_kernels.restype = ctypes.c_char_p
        abi, fields = lib.nattn_abi_version(), lib.nattn_num_problem_fields()
        if kernel_table.ABI_PROBLEM_FIELDS.get(abi) != fields:
            raise OSError(
                f"{path} has ABI {abi} with {fields} problem fields; this nattn expects ABI "
                f"{kernel_table.ABI_VERSION} with {kernel_table.NUM_PROBLEM_FIELDS} (or an older one of "
                f"{kernel_table.ABI_PROBLEM_FIELDS}): rebuild it"
            )
        # An older ABI (a prefix of the problem struct): calls pass its field count and version.
        self.abi, self.num_fields = int(abi), int(fields)
        sig = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p,
               ctypes.c_char_p, ctypes.c_int64]
        for name in ("nattn_forward", "nattn_backward"):
            fn = getattr(lib, name)
            fn.argtypes = sig
            fn.restype = ctypes.c_int
        self.forward = lib.nattn_forward
        self.backward = lib.nattn_backward
        # Per NA dim, the window from which a forward runs the Hopper family, then per (NA
        # dim, head dim) where the head dim moves it, and the same for a backward (older
        # builds lack some: empty tables, and a backward falls back to the forward's).
        self.sm90_min_window = _int_table(lib, "nattn_sm90_min_window", _NA_DIMS)
        self.sm90_min_window_head = _int_table(lib, "nattn_sm90_min_window_head", _NA_HEAD_DIMS)
        self.sm90_min_window_backward = (_int_table(lib, "nattn_sm90_min_window_backward", _NA_DIMS)
                                         or dict(self.sm90_min_window))
        self.sm90_min_window_backward_head = _int_table(lib, "nattn_sm90_min_window_backward_head", _NA_HEAD_DIMS)
        # Per NA dim, the window from which head dims without a Hopper instance (D != D_v, or
        # between its head dims) run it zero-padded (0: never; empty: older builds, which never pad).
        self.sm90_padded_min_window = _int_table(lib, "nattn_sm90_padded_min_window", _NA_DIMS)
        # (dtype, na_dim, head_dim) with a Hopper backward (none: older builds)
        self.sm90_backward = set()
        if hasattr(lib, "nattn_sm90_has_backward"):
            fn = lib.nattn_sm90_has_backward
            fn.restype = ctypes.c_int64
            fn.argtypes = [ctypes.c_int64] * 3
            self.sm90_backward = {(dt, n, hd) for code, dt in enumerate(kernel_table.DTYPES) for n in (1, 2, 3)
                                  for hd in (32, 64, 128, 256) if fn(code, n, hd)}
        self._sm90_configs = getattr(lib, "nattn_sm90_configs", None)
        if self._sm90_configs is not None:
            self._sm90_configs.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64,
                                           ctypes.c_char_p, ctypes.c_int64]
            self._sm90_configs.restype = ctypes.c_int
        self._sm90_preferred = getattr(lib, "nattn_sm90_preferred", None)  # older builds: none
        if self._sm90_preferred is not None:
            self._sm90_preferred.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                             ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p, ctypes.c_int64]
            self._sm90_preferred.restype = ctypes.c_int
        # The unfused window ops (older builds: none): (dtype, na_dim) instances
        self.window_ops = set()
        self.window_op = getattr(lib, "nattn_window_op", None)
        if self.window_op is not None:
            self.window_op.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p,
                                       ctypes.c_int64]
            self.window_op.restype = ctypes.c_int
            lib.nattn_window_kernels.restype = ctypes.c_char_p
            for item in lib.nattn_window_kernels().decode().split(";"):
                if item:
                    code, na_dim = item.split(":")
                    self.window_ops.add((kernel_table.DTYPES[int(code)], int(na_dim)))
        # The forward LayerNorm (nattn/nn/fast_norm.py; older builds: none)
        self.layer_norm = getattr(lib, "nattn_layer_norm", None)
        self.layer_norm_max_channels = 0
        if self.layer_norm is not None:
            self.layer_norm.argtypes = [ctypes.c_int64] * 11 + [ctypes.c_double, ctypes.c_int64, ctypes.c_void_p,
                                                                ctypes.c_char_p, ctypes.c_int64]
            self.layer_norm.restype = ctypes.c_int
            lib.nattn_layer_norm_max_channels.restype = ctypes.c_int64
            self.layer_norm_max_channels = int(lib.nattn_layer_norm_max_channels())
        # The residual add fused into it (older builds: none)
        self.add_layer_norm = getattr(lib, "nattn_add_layer_norm", None)
        if self.add_layer_norm is not None:
            self.add_layer_norm.argtypes = [ctypes.c_int64] * 16 + [ctypes.c_double, ctypes.c_int64, ctypes.c_void_p,
                                                                    ctypes.c_char_p, ctypes.c_int64]
            self.add_layer_norm.restype = ctypes.c_int
        # Families whose kernels run attention dropout (dropout_families, asked per access).
        self._dropout_families = None
        if self.abi >= 3 and hasattr(lib, "nattn_dropout_families"):
            lib.nattn_dropout_families.restype = ctypes.c_char_p
            self._dropout_families = lib.nattn_dropout_families
        # (family, dtype, na_dim) -> sorted head-dim buckets
        self.kernels = {}
        for item in lib.nattn_kernels().decode().split(";"):
            if item:
                family, dtype, na_dim, head_dim = item.split(":")
                self.kernels.setdefault((family, dtype, int(na_dim)), []).append(int(head_dim))
        for buckets in self.kernels.values():
            buckets.sort()
        # NA dim -> head-dim buckets of the TF32 instances (the tensor-core family's float32 ones,
        # which run a float32 call whose allow_tf32 field is 1); none before ABI 4, whose problem
        # struct has no allow_tf32 (such a library runs float32 on its SIMT family only).
        self.tf32 = {}
        if self.abi >= 4:
            self.tf32 = {nd: dims for (family, dtype, nd), dims in self.kernels.items()
                         if family == kernel_table.TF32_FAMILY and dtype == "float32"}


    @property
    def dropout_families(self) -> set:
        """The families whose kernels run attention dropout: {"tc", "simt"} (those compiled;
        older libraries list "simt" only while NATTN_SIMT_DROPOUT=1 is set, which they read on
        every call, so this asks the library on every access); empty for builds
        before ABI 3, whose problem struct has no dropout fields (the cuda backend then declines
        dropout)."""
        fn = self._dropout_families
        return {f for f in fn().decode().split(";") if f} if fn is not None else set()

    def sm90_configs(self, fields) -> list:
        """The Hopper family's tile pairs for a forward problem (packed fields), as dicts
        ``name, keys, default, backward, backward_default, named_only, declined`` (the reason,
        or None; ``backward_default``: the pair a backward runs; ``named_only``: a forward that
        runs only when a call names the pair); [] when this build
        has no sm90 kernel for it. Raises ValueError with libnattn's message for a bad problem."""
        if self._sm90_configs is None:
            return []
        out, err = ctypes.create_string_buffer(1 << 14), ctypes.create_string_buffer(1024)
        fields[0] = self.abi  # abi_version (an older library reads a prefix of the fields)
        rc = self._sm90_configs(ctypes.cast(fields, ctypes.c_void_p), self.num_fields, out, len(out), err, len(err))
        if rc:
            raise ValueError(err.value.decode(errors="replace"))
        configs = []
        for line in filter(None, out.value.decode().split("\n")):
            parts = line.split(" ", 2)
            flags, _, declined = (parts[2] if len(parts) > 2 else "").partition("declined:")
            words = flags.split()
            configs.append(dict(name=parts[0], keys=int(parts[1]), default="default" in words,
                                backward="backward" in words, backward_default="backward_default" in words,
                                named_only="named" in words, declined=declined or None))
        return configs

    def sm90_preferred(self, fields, backward: bool = False) -> Optional[str]:
        """Whether libnattn's default rules run a problem (packed forward fields) on its Hopper
        family on a compute capability 9.0 GPU: "native", "padded" (zero-padded head dims) or
        "" (another family); None when this build cannot say (older than the query). The
        rules alone: split-KV's small-grid rule, which depends on the GPU, is left out.
        Raises ValueError with libnattn's message for a bad problem."""
        if self._sm90_preferred is None:
            return None
        out, err = ctypes.c_int64(0), ctypes.create_string_buffer(1024)
        fields[0] = self.abi
        rc = self._sm90_preferred(ctypes.cast(fields, ctypes.c_void_p), self.num_fields, int(backward),
                                  ctypes.byref(out), err, len(err))
        if rc:
            raise ValueError(err.value.decode(errors="replace"))
        return ("", "native", "padded")[out.value]


def load() -> Optional[Library]:
    """The library, loaded once per process, or None when it is missing or broken."""
    if not _state["tried"]:
        _state["tried"] = True
        path = library_path()
        if path is None:
            _state["error"] = (
                f"libnattn is not built: no {LIBRARY_NAME} in {os.path.dirname(__file__)} and "
                "NATTN_LIBRARY is unset (install with NATTN_CUDA_ARCH set, e.g. "
                "NATTN_CUDA_ARCH=9.0 pip install .)"
            )
        else:
            try:
                _state["lib"] = Library(path)
            except OSError as e:
                _state["error"] = f"libnattn at {path} could not be loaded: {e}"
    return _state["lib"]


def load_error() -> Optional[str]:
    load()
    return _state["error"]


def reset() -> None:
    """Forget the loaded library (tests use this to simulate a missing library)."""
    _state.update(lib=None, tried=False, error=None)
