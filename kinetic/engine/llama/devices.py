"""ggml's backends, devices and buffer types, for -dev, --list-devices, -ot, --cpu-moe, --n-cpu-moe and the
offload log (offload.py).

llama-cpp-python binds none of ggml's backend registry, and leaves llama_model_params' `devices` and
`tensor_buft_overrides` as bare pointers; these are ctypes bindings to the ggml libraries it ships, and
the arrays llama.cpp reads, built as llama.cpp's common/arg.cpp builds them.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from llama_cpp._ggml import libggml

# ggml_backend_dev_type
DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}
CPU_DEVICE = 0
# llama.cpp's common.h: the MoE expert tensors (--cpu-moe) and a layer's block prefix (--n-cpu-moe)
FFN_EXPERTS_PATTERN = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
FFN_DENSE_PATTERN = r"\.ffn_(up|down|gate)\."


class TensorBufferOverride(ctypes.Structure):
    """llama.h's llama_model_tensor_buft_override: tensors whose name matches `pattern` go to `buft`."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass(frozen=True)
class Device:
    name: str
    description: str
    type: str
    memory_total: int
    memory_free: int
    handle: int  # ggml_backend_dev_t


@cache
def _ggml() -> ctypes.CDLL:
    """libggml with the signatures used here (libggml-base and libggml-cpu are its dependencies, so
    dlsym on its handle finds their symbols too)."""
    lib = libggml
    pointer, size = ctypes.c_void_p, ctypes.c_size_t
    for name, argtypes, restype in (
        ("ggml_backend_load_all", [], None),
        ("ggml_backend_reg_count", [], size),
        ("ggml_backend_reg_get", [size], pointer),
        ("ggml_backend_reg_name", [pointer], ctypes.c_char_p),
        ("ggml_backend_dev_count", [], size),
        ("ggml_backend_dev_get", [size], pointer),
        ("ggml_backend_dev_by_name", [ctypes.c_char_p], pointer),
        ("ggml_backend_dev_name", [pointer], ctypes.c_char_p),
        ("ggml_backend_dev_description", [pointer], ctypes.c_char_p),
        ("ggml_backend_dev_type", [pointer], ctypes.c_int),
        ("ggml_backend_dev_memory", [pointer, ctypes.POINTER(size), ctypes.POINTER(size)], None),
        ("ggml_backend_dev_buffer_type", [pointer], pointer),
        ("ggml_backend_buft_name", [pointer], ctypes.c_char_p),
        ("ggml_backend_cpu_buffer_type", [], pointer),
    ):
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype
    lib.ggml_backend_load_all()  # backends built as loadable modules register here (a no-op when linked in)
    return lib


def backends() -> list[str]:
    """The names of ggml's registered backends (`CUDA`, `Metal`, `Vulkan`, `CPU`...): what this build can run on."""
    lib = _ggml()
    registry = (lib.ggml_backend_reg_get(i) for i in range(lib.ggml_backend_reg_count()))
    return [lib.ggml_backend_reg_name(reg).decode() for reg in registry]


def devices() -> list[Device]:
    """Every device ggml registered, the CPU included."""
    lib = _ggml()
    found = []
    for index in range(lib.ggml_backend_dev_count()):
        handle = lib.ggml_backend_dev_get(index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
        found.append(Device(name=lib.ggml_backend_dev_name(handle).decode(),
                            description=lib.ggml_backend_dev_description(handle).decode(),
                            type=DEVICE_TYPES.get(lib.ggml_backend_dev_type(handle), "?"),
                            memory_total=total.value, memory_free=free.value, handle=handle))
    return found


def list_devices_text() -> str:
    """--list-devices, worded as llama-server prints it: the devices a model can be offloaded to."""
    mib = 1024 * 1024
    offload = [d for d in devices() if d.type != "CPU"]
    lines = ["Available devices:"]
    lines += [f"  {d.name}: {d.description} ({d.memory_total // mib} MiB, {d.memory_free // mib} MiB free)"
              for d in offload] or ["  (none)"]
    return "\n".join(lines)


def parse_device_list(value: str) -> list[str]:
    """-dev's value checked against this machine: the device names, or [] for `none` (no offload)."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise ValueError("no devices specified")
    if names == ["none"]:
        return []
    offload = {d.name: d for d in devices() if d.type != "CPU"}
    for name in names:
        if name not in offload:
            available = ", ".join(offload) or "none: this build offloads to no device"
            raise ValueError(f"invalid device: {name} (available: {available}; see --list-devices)")
    return names


def buffer_types() -> dict[str, int]:
    """Buffer type name -> handle, for -ot's `PATTERN=TYPE`: each device's default type, as llama.cpp lists."""
    lib = _ggml()
    types: dict[str, int] = {}
    for device in devices():
        buft = lib.ggml_backend_dev_buffer_type(device.handle)
        if buft:
            types[lib.ggml_backend_buft_name(buft).decode()] = buft
    return types


def parse_tensor_overrides(value: str) -> list[tuple[str, str]]:
    """-ot's `PATTERN=TYPE,...` as (pattern, buffer type name) pairs, each type one this build has."""
    known = buffer_types()
    pairs = []
    for item in value.split(","):
        pattern, sep, buft = item.partition("=")
        if not sep or not pattern:
            raise ValueError(f"{item!r} is not <tensor name pattern>=<buffer type>")
        if buft not in known:
            raise ValueError(f"unknown buffer type {buft!r} (available: {', '.join(sorted(known))})")
        re.compile(pattern)  # llama.cpp matches with std::regex_search; a bad pattern fails here, not at load
        pairs.append((pattern, buft))
    return pairs


def cpu_layer_overrides(cpu_moe: bool, n_cpu_moe: int, n_cpu_ffn: int) -> list[tuple[str, str]]:
    """--cpu-moe (every layer's experts), --n-cpu-moe N (the first N layers' experts) and --n-cpu-ffn N (the
    first N layers' dense FFN) on the CPU buffer type."""
    cpu = _cpu_buffer_type_name()
    pairs = [(FFN_EXPERTS_PATTERN, cpu)] if cpu_moe else []
    pairs += [(rf"blk\.{layer}{FFN_EXPERTS_PATTERN}", cpu) for layer in range(n_cpu_moe)]
    pairs += [(rf"blk\.{layer}{FFN_DENSE_PATTERN}", cpu) for layer in range(n_cpu_ffn)]
    return pairs


def _cpu_buffer_type_name() -> str:
    lib = _ggml()
    return lib.ggml_backend_buft_name(lib.ggml_backend_cpu_buffer_type()).decode()


def device_array(names: tuple[str, ...] | None) -> Any:
    """llama_model_params.devices: NULL-terminated device handles; None leaves llama.cpp's default (all)."""
    if names is None:
        return None
    lib = _ggml()
    handles = [lib.ggml_backend_dev_by_name(name.encode()) for name in names]
    return (ctypes.c_void_p * (len(handles) + 1))(*handles, None)


def override_array(pairs: tuple[tuple[str, str], ...]) -> Any:
    """llama_model_params.tensor_buft_overrides: NULL-terminated (pattern, buffer type) pairs, or None."""
    if not pairs:
        return None
    known = buffer_types()
    lib = _ggml()
    known.setdefault(_cpu_buffer_type_name(), lib.ggml_backend_cpu_buffer_type())
    array = (TensorBufferOverride * (len(pairs) + 1))()
    for entry, (pattern, buft) in zip(array, pairs, strict=False):  # the array's last entry ends the list
        entry.pattern = pattern.encode()
        entry.buft = known[buft]
    return array
