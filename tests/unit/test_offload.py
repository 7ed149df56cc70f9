"""Where llama.cpp puts a model's layers (kinetic.engine.llama.offload), for machines CI does not have: ggml's
device registry is replaced by lists of GPUs, and each case is what llama.cpp's own load would choose."""

from __future__ import annotations

import pytest

from kinetic.config.args import parse_serve_args
from kinetic.engine.llama import devices, offload
from kinetic.engine.options import LlamaOptions

GIB = 1024**3
CPU = devices.Device("CPU", "AMD EPYC", "CPU", 64 * GIB, 60 * GIB, handle=1)
H200 = [devices.Device(f"CUDA{i}", "NVIDIA H200", "GPU", 141 * GIB, 140 * GIB, handle=10 + i) for i in range(2)]
IGPU = devices.Device("Vulkan0", "AMD Radeon 780M", "IGPU", 16 * GIB, 8 * GIB, handle=20)


def options(*argv: str) -> LlamaOptions:
    return parse_serve_args(list(argv), environ={}).llama_options()


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> list[devices.Device]:
    """Two H200s beside the CPU, under the CUDA and CPU backends."""
    every = [*H200, CPU]
    monkeypatch.setattr(devices, "devices", lambda: every)
    monkeypatch.setattr(devices, "backends", lambda: ["CUDA", "CPU"])
    return every


@pytest.mark.parametrize(("argv", "offloaded", "names", "reason"), [
    (["-ngl", "99"], 25, ["CUDA0", "CUDA1"], ""),
    ([], 25, ["CUDA0", "CUDA1"], ""),  # -ngl auto: every layer, llama.cpp's default
    (["-ngl", "all"], 25, ["CUDA0", "CUDA1"], ""),
    (["-ngl", "10", "-ts", "3,1"], 10, ["CUDA0", "CUDA1"], ""),
    (["-ngl", "99", "-sm", "none", "-mg", "1"], 25, ["CUDA1"], ""),
    (["-ngl", "99", "-dev", "CUDA1"], 25, ["CUDA1"], ""),
    (["-ngl", "0"], 0, ["CPU"], "-ngl 0"),
    (["-ngl", "99", "-dev", "none"], 0, ["CPU"], "-dev none"),
])
def test_the_layers_go_where_llama_cpp_puts_them(machine: list[devices.Device], argv: list[str], offloaded: int,
                                                 names: list[str], reason: str) -> None:
    placed = offload.placement(options(*argv), n_layer=24)
    assert (placed.layers_offloaded, placed.layers) == (offloaded, 25)
    assert [d.name for d in placed.devices] == names
    assert placed.cpu_reason == reason
    assert placed.backends == ("CUDA", "CPU")


def test_a_gpu_start_logs_the_backends_the_devices_and_the_layers(machine: list[devices.Device]) -> None:
    lines = offload.log_lines(offload.placement(options("-ngl", "99", "-sm", "none"), n_layer=24))
    assert lines == ["backends: CUDA, CPU", "using device CUDA0 (NVIDIA H200) - 143360 MiB free",
                     "offloaded 25/25 layers to GPU"]


def test_an_integrated_gpu_is_used_only_without_a_discrete_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "devices", lambda: [IGPU, CPU])
    monkeypatch.setattr(devices, "backends", lambda: ["Vulkan", "CPU"])
    assert [d.name for d in offload.placement(options("-ngl", "99"), n_layer=18).devices] == ["Vulkan0"]
    monkeypatch.setattr(devices, "devices", lambda: [IGPU, H200[0], CPU])
    assert [d.name for d in offload.placement(options("-ngl", "99"), n_layer=18).devices] == ["CUDA0"]


def test_a_cpu_only_build_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "devices", lambda: [CPU])
    monkeypatch.setattr(devices, "backends", lambda: ["CPU"])
    placed = offload.placement(options("-ngl", "99"), n_layer=18)
    assert (placed.layers_offloaded, placed.layers, placed.cpu_reason) == (0, 19, "this llama.cpp build has no GPU "
                                                                                  "backend")
    assert offload.log_lines(placed) == ["offloaded 0/19 layers to GPU: this llama.cpp build has no GPU backend "
                                         "(backends: CPU); the model runs on the CPU (AMD EPYC)"]


def test_this_machines_registry_is_read() -> None:
    """The real registry (CI's build: the CPU backend at least) answers the bindings offload.py calls."""
    assert "CPU" in devices.backends()
    placed = offload.placement(LlamaOptions(), n_layer=18)
    assert placed.devices and placed.layers == 19
