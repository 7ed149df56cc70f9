"""LlamaOptions (llama-server's model and context flags) as llama.cpp's llama_model_params and
llama_context_params: the one place they are built, so a unit test can read every field it sets.

Arrays a struct points into (tensor split, metadata overrides) are returned with it in `keep`: they
must outlive the load call that reads them.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp

from kinetic.engine.llama import devices
from kinetic.engine.options import KV_CACHE_TYPES, LlamaOptions

SPLIT_MODES = {"none": llama_cpp.LLAMA_SPLIT_MODE_NONE, "layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER,
               "row": llama_cpp.LLAMA_SPLIT_MODE_ROW, "tensor": llama_cpp.LLAMA_SPLIT_MODE_TENSOR}
LOAD_MODES = {"auto": llama_cpp.LLAMA_LOAD_MODE_AUTO, "none": llama_cpp.LLAMA_LOAD_MODE_NONE,
              "mmap": llama_cpp.LLAMA_LOAD_MODE_MMAP, "mlock": llama_cpp.LLAMA_LOAD_MODE_MLOCK,
              "mmap+mlock": llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK, "dio": llama_cpp.LLAMA_LOAD_MODE_DIRECT_IO}
LAZY_MODES = {"off": llama_cpp.LLAMA_LAZY_MODE_OFF, "auto": llama_cpp.LLAMA_LAZY_MODE_AUTO,
              "on": llama_cpp.LLAMA_LAZY_MODE_ON}
FLASH_ATTN = {"on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED, "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
              "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO}
ROPE_SCALING = {"none": llama_cpp.LLAMA_ROPE_SCALING_TYPE_NONE, "linear": llama_cpp.LLAMA_ROPE_SCALING_TYPE_LINEAR,
                "yarn": llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN}
NUMA = {"distribute": llama_cpp.GGML_NUMA_STRATEGY_DISTRIBUTE, "isolate": llama_cpp.GGML_NUMA_STRATEGY_ISOLATE,
        "numactl": llama_cpp.GGML_NUMA_STRATEGY_NUMACTL}
KV_OVERRIDE_TAGS = {"int": llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, "float": llama_cpp.LLAMA_KV_OVERRIDE_TYPE_FLOAT,
                    "bool": llama_cpp.LLAMA_KV_OVERRIDE_TYPE_BOOL, "str": llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR}


@dataclass
class ModelParams:
    params: llama_cpp.llama_model_params
    keep: list[Any] = field(default_factory=list)  # ctypes arrays the params point into


def cpu_has_amx() -> bool:
    """Whether this CPU has Intel AMX (Linux tells; elsewhere assume not)."""
    try:
        return "amx_int8" in Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False


def model_params(options: LlamaOptions) -> ModelParams:
    params = llama_cpp.llama_model_default_params()
    built = ModelParams(params)
    params.n_gpu_layers = options.n_gpu_layers
    params.split_mode = SPLIT_MODES[options.split_mode]
    params.main_gpu = options.main_gpu
    params.load_mode = LOAD_MODES[options.load_mode]
    params.lazy_mode = LAZY_MODES[options.lazy_mode]
    params.check_tensors = options.check_tensors
    # Off unless --repack (llama-server's default is on). The repacked kernels compute a row of a many-row
    # batch (a prompt) in another order than a one-row batch (a re-evaluated last prompt token, a decode
    # step), so a request whose prompt came from the cache could get other logits than fresh and part
    # ways at a near tie; the plain kernels compute each row alike. And llama-cpp-python compiles llama.cpp
    # for the machine it is installed on: on a CPU with AMX, ggml's AMX kernels (also an extra buffer type)
    # crash the process on the bundled Gemma's first decode (SIGSEGV in ggml_backend_amx_mul_mat), so
    # there --repack stays off too.
    params.use_extra_bufts = options.repack and not cpu_has_amx()
    params.no_host = options.no_host
    if options.tensor_split:
        max_devices = llama_cpp.llama_max_devices()
        split = (ctypes.c_float * max_devices)(*options.tensor_split[:max_devices])
        built.keep.append(split)
        params.tensor_split = split
    if options.devices is not None:
        device_list = devices.device_array(options.devices)
        built.keep.append(device_list)
        params.devices = ctypes.cast(device_list, ctypes.c_void_p)
    if options.tensor_overrides:
        overrides_list = devices.override_array(options.tensor_overrides)
        built.keep.append(overrides_list)
        params.tensor_buft_overrides = ctypes.cast(overrides_list, ctypes.c_void_p)
    if options.kv_overrides:
        # NULL-terminated: the last element's empty key ends the list
        overrides = (llama_cpp.llama_model_kv_override * (len(options.kv_overrides) + 1))()
        for slot, override in zip(overrides, options.kv_overrides, strict=False):
            slot.key = override.key.encode("utf-8")
            slot.tag = KV_OVERRIDE_TAGS[override.type]
            if override.type == "int":
                slot.value.val_i64 = int(override.value)
            elif override.type == "float":
                slot.value.val_f64 = float(override.value)
            elif override.type == "bool":
                slot.value.val_bool = bool(override.value)
            else:
                slot.value.val_str = str(override.value).encode("utf-8")
        built.keep.append(overrides)
        params.kv_overrides = overrides
    return built


def context_params(options: LlamaOptions, *, n_ctx: int, n_batch: int, n_ubatch: int, n_seq_max: int,
                   n_threads: int, kv_unified: bool) -> llama_cpp.llama_context_params:
    """The generation context's params: the slots' sizes plus what the flags ask."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = min(n_batch, n_ctx)
    params.n_ubatch = min(n_ubatch, params.n_batch)
    params.n_seq_max = n_seq_max
    params.n_threads = n_threads
    params.n_threads_batch = options.threads_batch if options.threads_batch > 0 else n_threads
    params.kv_unified = kv_unified
    # Full-size sliding-window cache, so a slot's cached prefix stays reusable (Gemma 3 uses SWA).
    params.swa_full = True
    params.no_perf = not options.perf
    params.flash_attn_type = FLASH_ATTN[options.flash_attn]
    params.type_k = KV_CACHE_TYPES[options.cache_type_k]
    params.type_v = KV_CACHE_TYPES[options.cache_type_v]
    params.offload_kqv = options.kv_offload
    params.op_offload = options.op_offload
    if options.rope_scaling is not None:
        params.rope_scaling_type = ROPE_SCALING[options.rope_scaling]
    params.rope_freq_base = options.rope_freq_base
    params.rope_freq_scale = options.rope_freq_scale
    params.yarn_orig_ctx = options.yarn_orig_ctx
    params.yarn_ext_factor = options.yarn_ext_factor
    params.yarn_attn_factor = options.yarn_attn_factor
    params.yarn_beta_slow = options.yarn_beta_slow
    params.yarn_beta_fast = options.yarn_beta_fast
    return params


def init_numa(options: LlamaOptions) -> None:
    """--numa: llama.cpp's process-wide NUMA strategy, set before a model loads (as llama-server does)."""
    if options.numa is not None:
        llama_cpp.llama_numa_init(NUMA[options.numa])
