"""nattn.bench's GPU state line (nvidia-smi's SM clock and power), with nvidia-smi faked."""

import subprocess

import torch

from nattn.bench import gpu_state


def test_parse_reads_the_query_line():
    got = gpu_state.parse("1680, 1980, 689.94, 700.00, 59\n")
    assert got == {"sm_mhz": 1680.0, "max_sm_mhz": 1980.0, "power_w": 689.94, "power_limit_w": 700.0,
                   "temperature_c": 59.0}
    assert gpu_state.describe(got) == "SM clock 1680 of 1980 MHz, 690 of 700 W, 59 C"


def test_parse_rejects_what_it_cannot_read():
    assert gpu_state.parse("[N/A], 1980, 80, 700, 33") is None
    assert gpu_state.parse("1680, 1980") is None
    assert gpu_state.parse("") is None


def test_read_without_nvidia_smi_or_cuda_is_none(monkeypatch):
    monkeypatch.setattr(gpu_state.shutil, "which", lambda name: None)
    assert gpu_state.read(torch.device("cuda", 0)) is None
    monkeypatch.setattr(gpu_state.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    assert gpu_state.read(torch.device("cpu")) is None


def test_read_asks_for_the_device_by_uuid_and_parses(monkeypatch):
    calls = []

    class Props:
        uuid = "58e6c3b8-1234"

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout="1980, 1980, 85.3, 700.00, 35\n", stderr="")

    monkeypatch.setattr(gpu_state.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(gpu_state.torch.cuda, "get_device_properties", lambda index: Props())
    monkeypatch.setattr(gpu_state.subprocess, "run", fake_run)
    state = gpu_state.read(torch.device("cuda", 1))
    assert state["sm_mhz"] == 1980.0 and state["power_limit_w"] == 700.0
    assert calls[0][-2:] == ["-i", "GPU-58e6c3b8-1234"]


def test_read_survives_a_failing_or_hanging_nvidia_smi(monkeypatch):
    class Props:
        uuid = "x"

    monkeypatch.setattr(gpu_state.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(gpu_state.torch.cuda, "get_device_properties", lambda index: Props())

    def failing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 9, stdout="", stderr="No devices were found")

    def hanging(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw.get("timeout"))

    for fake in (failing, hanging):
        monkeypatch.setattr(gpu_state.subprocess, "run", fake)
        assert gpu_state.read(torch.device("cuda", 0)) is None
