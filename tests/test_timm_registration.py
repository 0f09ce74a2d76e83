"""nattn's models reach timm's registry whichever of the two is imported first, and
``import nattn`` alone does not import timm (fresh interpreters: import state is global)."""

import subprocess
import sys

import pytest

pytest.importorskip("timm")


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_nattn_does_not_import_timm():
    assert run("import sys, nattn; print('timm' in sys.modules, 'torchvision' in sys.modules)") == "False False"


@pytest.mark.parametrize("first", ["nattn", "timm"])
def test_models_registered_in_either_import_order(first):
    second = "timm" if first == "nattn" else "nattn"
    code = (f"import {first}, {second}, timm, torch\n"
            "names = timm.list_models('dinat_*') + timm.list_models('nat_*')\n"
            "m = timm.create_model('nat_mini', num_classes=3)\n"
            "print(len(names) > 4, tuple(m(torch.randn(1, 3, 64, 64)).shape))")
    assert run(code) == "True (1, 3)"


def test_importing_nattn_models_registers_them():
    assert run("import nattn.models, timm; print(timm.is_model('dinat_tiny'))") == "True"
