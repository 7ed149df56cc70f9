"""Where llama.cpp puts a model's layers, worked out as llama.cpp works it out at load, and said at start as
llama-server says it: the backends, the devices the layers go to, and "offloaded N/M layers to GPU".

llama-server prints llama.cpp's own lines (src/llama.cpp's "using device", src/llama-model.cpp's
"offloaded N/M layers to GPU"); kinetic leaves llama.cpp's log off unless -v, so it says the same from the
same facts: ggml's registered backends and devices (devices.py), the -dev, -sm and -mg that choose among
them, -ngl, and the model's layer count. The one difference: llama.cpp prints its offload count from -ngl
alone whenever the build could offload; this is the count that went to a device, 0 when none was chosen.
"""

from __future__ import annotations

from kinetic.engine.llama import devices
from kinetic.engine.options import LlamaOptions
from kinetic.engine.types import DeviceInfo, Offload

OFFLOAD_TYPES = ("GPU", "IGPU")


def _info(device: devices.Device) -> DeviceInfo:
    return DeviceInfo(name=device.name, description=device.description, type=device.type,
                      memory_total=device.memory_total, memory_free=device.memory_free)


def offload_devices(options: LlamaOptions, every: list[devices.Device]) -> tuple[list[devices.Device], str]:
    """The devices llama.cpp gives the model (src/llama.cpp, llama_model_load_from_file_impl): those -dev names,
    else every GPU, else every integrated GPU; -sm none keeps -mg's alone (none when -mg is negative).
    With none, also why."""
    if options.devices is not None:
        by_name = {d.name: d for d in every}
        chosen = [by_name[name] for name in options.devices if name in by_name]
        if not chosen:
            return [], "-dev none"
    else:
        chosen = [d for d in every if d.type == "GPU"] or [d for d in every if d.type == "IGPU"]
        if not chosen:
            return [], "this llama.cpp build has no GPU backend"
    if options.split_mode == "none":
        if options.main_gpu < 0 or options.main_gpu >= len(chosen):
            return [], f"-sm none with -mg {options.main_gpu}"
        chosen = [chosen[options.main_gpu]]
    return chosen, ""


def placement(options: LlamaOptions, n_layer: int) -> Offload:
    """Where a model of `n_layer` layers goes with these options: llama.cpp counts its layers plus the output
    layer, and offloads min(-ngl, that) of them (a negative -ngl: all) when it has a device to put them on."""
    every = devices.devices()
    chosen, reason = offload_devices(options, every)
    layers = n_layer + 1
    asked = options.n_gpu_layers if options.n_gpu_layers >= 0 else layers
    offloaded = min(asked, layers) if chosen else 0
    if chosen and offloaded == 0:
        reason = f"-ngl {options.n_gpu_layers}"
    shown = chosen if offloaded else [d for d in every if d.type == "CPU"][:1]
    return Offload(backends=tuple(devices.backends()), devices=tuple(_info(d) for d in shown),
                   layers_offloaded=offloaded, layers=layers, cpu_reason="" if offloaded else reason)


def log_lines(offload: Offload) -> list[str]:
    """llama-server's start lines about the offload; on the CPU, one line that says so and why."""
    mib = 1024 * 1024
    counted = f"offloaded {offload.layers_offloaded}/{offload.layers} layers to GPU"
    if not offload.layers_offloaded:
        cpu = offload.devices[0].description if offload.devices else "CPU"
        return [f"{counted}: {offload.cpu_reason} (backends: {', '.join(offload.backends)}); "
                f"the model runs on the CPU ({cpu})"]
    return [f"backends: {', '.join(offload.backends)}",
            *(f"using device {d.name} ({d.description}) - {d.memory_free // mib} MiB free" for d in offload.devices),
            counted]
