"""The install-time decisions: which archs to build, what the build needs, what it says.

No compiler runs here: nvidia-smi, nvcc and setuptools are replaced by stubs.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "build_backend"))
pytest.importorskip("setuptools")  # the backend wraps setuptools.build_meta

import nattn_archs  # noqa: E402
import nattn_build_backend as backend  # noqa: E402
import nattn_console  # noqa: E402

from nattn.build_info import describe  # noqa: E402

TOOLCHAIN = {"cmake>=3.24", "ninja", "nvidia-cutlass>=4.2"}


@pytest.fixture
def machine(monkeypatch):
    """A machine whose GPUs and nvcc the test sets: machine(gpus=("9.0",), nvcc=True)."""
    monkeypatch.delenv("NATTN_CUDA_ARCH", raising=False)

    def set_up(gpus=(), nvcc=False):
        monkeypatch.setattr(nattn_archs, "gpu_archs", lambda: tuple(gpus))
        found = "/cuda/bin/nvcc" if nvcc else None
        monkeypatch.setattr(nattn_archs, "find_nvcc", lambda env=None: found)

    set_up()
    return set_up


@pytest.mark.parametrize("value, archs", [
    ("9.0", ("9.0",)),
    ("9.0;8.0", ("8.0", "9.0")),
    (" 8.6, 9.0 8.6 ", ("8.6", "9.0")),
    ("10.0;9.0", ("9.0", "10.0")),
    ("none", ()), ("None", ()), ("", ()), ("0", ()),
])
def test_parse_archs(value, archs):
    assert nattn_archs.parse_archs(value) == archs


@pytest.mark.parametrize("value", ["sm_90", "90", "9", "9.0a", "8.0;x"])
def test_parse_archs_rejects_with_accepted_forms(value):
    with pytest.raises(ValueError, match=r"NATTN_CUDA_ARCH=.*major\.minor.*NATTN_CUDA_ARCH=none"):
        nattn_archs.parse_archs(value)


def test_request_env_wins_over_gpu(machine):
    machine(gpus=("9.0",), nvcc=True)
    assert nattn_archs.request({"NATTN_CUDA_ARCH": "none"}).archs == ()
    assert nattn_archs.request({"NATTN_CUDA_ARCH": "8.0"}).archs == ("8.0",)
    assert nattn_archs.request({}).archs == ("9.0",)


def test_request_no_gpu_is_pure_python(machine):
    req = nattn_archs.request({})
    assert req.archs == () and "no GPU" in req.why
    assert 'NATTN_CUDA_ARCH="9.0" pip install' in nattn_archs.notice(req)


def test_request_gpu_without_nvcc_is_pure_python_and_names_the_gpu(machine):
    machine(gpus=("8.6",), nvcc=False)
    req = nattn_archs.request({})
    assert req.archs == () and "no nvcc" in req.why
    line = nattn_archs.notice(req)
    assert "\n" not in line and 'NATTN_CUDA_ARCH="8.6"' in line


def test_notice_names_the_built_archs(machine):
    line = nattn_archs.notice(nattn_archs.request({"NATTN_CUDA_ARCH": "8.0;9.0"}))
    assert "\n" not in line and "sm_80, sm_90" in line and "pip install -v" in line


def test_gpu_archs_reads_nvidia_smi(monkeypatch):
    monkeypatch.setattr(nattn_archs.shutil, "which", lambda name: "/usr/bin/" + name)
    answers = {"out": "9.0\n8.6\n9.0\n"}
    monkeypatch.setattr(nattn_archs.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, answers["out"], ""))
    assert nattn_archs.gpu_archs() == ("8.6", "9.0")
    answers["out"] = 'Field "compute_cap" is not a valid field to query.\n'  # old driver
    assert nattn_archs.gpu_archs() == ()
    monkeypatch.setattr(nattn_archs.shutil, "which", lambda name: None)
    assert nattn_archs.gpu_archs() == ()


def test_find_nvcc_order(tmp_path):
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    empty = str(tmp_path / "empty")
    assert nattn_archs.find_nvcc({"CUDACXX": "/x/nvcc", "PATH": str(nvcc.parent)}) == "/x/nvcc"
    assert nattn_archs.find_nvcc({"PATH": str(nvcc.parent)}) == str(nvcc)
    assert nattn_archs.find_nvcc({"PATH": empty, "CUDA_HOME": str(tmp_path / "cuda")}) == str(nvcc)


@pytest.mark.parametrize("hook", ["get_requires_for_build_wheel",
                                  "get_requires_for_build_editable"])
def test_backend_adds_toolchain_only_for_kernels(machine, monkeypatch, hook):
    monkeypatch.setattr(backend._setuptools, hook, lambda config_settings=None: ["from-setuptools"])
    get_requires = getattr(backend, hook)
    assert get_requires() == ["from-setuptools"]  # no GPU: setuptools alone
    machine(gpus=("9.0",), nvcc=True)
    assert set(get_requires()) == TOOLCHAIN | {"from-setuptools"}
    monkeypatch.setenv("NATTN_CUDA_ARCH", "none")
    assert get_requires() == ["from-setuptools"]
    machine()
    monkeypatch.setenv("NATTN_CUDA_ARCH", "8.0")
    assert set(get_requires()) == TOOLCHAIN | {"from-setuptools"}
    monkeypatch.setenv("NATTN_CUDA_ARCH", "sm_80")
    with pytest.raises(ValueError, match="NATTN_CUDA_ARCH"):
        get_requires()


def test_build_hooks_say_the_notice_first(machine, monkeypatch):
    said = []
    monkeypatch.setattr(backend, "say", said.append)
    build = lambda *args: said.append("built") or "w.whl"  # noqa: E731
    monkeypatch.setattr(backend._setuptools, "build_wheel", build)
    assert backend.build_wheel("dist") == "w.whl"
    assert said[0].startswith("nattn: no CUDA kernels built") and said[1] == "built"


def test_pyproject_asks_setuptools_alone():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        system = tomllib.load(f)["build-system"]
    assert system["build-backend"] == "nattn_build_backend"
    assert system["backend-path"] == ["build_backend"]
    assert not any(r.startswith(("cmake", "nvidia-cutlass", "ninja")) for r in system["requires"])


def test_setup_py_asks_nattn_archs():
    with open(os.path.join(ROOT, "setup.py")) as f:
        source = f.read()
    assert "from nattn_archs import" in source and "nvidia-smi" not in source.split('"""', 2)[2]


@pytest.mark.parametrize("line, done", [
    ("[12/48] Building CUDA object x.cu.o", 0.25),
    ("[ 17%] Building CUDA object x.cu.o", 0.17),
    ("-- nattn: CUDA 13.0", None),
])
def test_progress_fraction(line, done):
    assert nattn_console.fraction(line) == done


def test_run_with_progress_passes_output_and_reports_steps(monkeypatch, capsys):
    shown = []
    monkeypatch.setattr(nattn_console, "to_terminal", shown.append)
    script = "for i in range(1, 21): print(f'[{i}/20] step')"
    nattn_console.run_with_progress([sys.executable, "-c", script], "compiling")
    assert capsys.readouterr().out.count("step") == 20  # every line still reaches pip -v
    assert len(shown) == 10 and shown[-1].startswith("nattn: compiling: 100%")
    with pytest.raises(subprocess.CalledProcessError):
        nattn_console.run_with_progress([sys.executable, "-c", "raise SystemExit(3)"], "x")


def test_describe_pure_python_install():
    config = {"library": None, "error": "libnattn is not built"}
    assert "to build them" in "\n".join(describe(config))
    warning = describe(config, gpu_arch="8.6")[-1]
    assert warning.startswith("warning:") and 'NATTN_CUDA_ARCH="8.6" pip install' in warning


def test_describe_built_library():
    config = {"library": "/x/libnattn.so", "archs": ["8.0", "9.0"], "toolkit": "13.0",
              "families": ["simt", "tc"], "dtypes": ["bfloat16"], "head_dims": [32, 64],
              "na_dims": [2]}
    (line,) = describe(config, gpu_arch="9.0")
    assert "archs 8.0/9.0" in line and "head dims 32/64" in line and "CUDA 13.0" in line
