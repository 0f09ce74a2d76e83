"""nattn.bench.timing on the CPU: the launch-only time calls the step as often as asked and
counts the time of the calls themselves."""

import time

import torch

from nattn.bench.timing import launch_only_ms, window_ms


def test_launch_only_ms_runs_each_call_and_times_it():
    calls = []

    def step():
        calls.append(1)
        time.sleep(0.002)

    ms = launch_only_ms(step, torch.device("cpu"), 4)
    assert len(calls) == 4
    assert ms >= 2.0  # each call sleeps 2 ms: a lower bound, no upper one
    assert window_ms(step, torch.device("cpu"), 3) >= 2.0 and len(calls) == 7
