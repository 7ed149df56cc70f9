"""llama-server's CPU flags (-C/-Cr, --cpu-strict, --prio, --poll and their -batch twins): ggml thread
pools made with them and attached to the generation context, as llama.cpp's common does.

llama-cpp-python binds neither ggml's thread pools nor llama_attach_threadpool; these are ctypes
bindings to the libraries it ships. Without any of the flags nothing is attached and llama.cpp makes
its own pools, as before.
"""

from __future__ import annotations

import ctypes
import logging
import os
from functools import cache

from llama_cpp import llama_cpp as llama_lib
from llama_cpp._ggml import libggml
from llama_cpp._internals import LlamaContext

from kinetic.engine.options import MAX_THREADS, PRIORITIES, CpuParams

log = logging.getLogger(__name__)

NICE = {-1: 5, 0: 0, 1: -5, 2: -10, 3: -20}  # llama.cpp's set_process_priority on POSIX


class ThreadpoolParams(ctypes.Structure):
    """ggml.h's ggml_threadpool_params."""

    _fields_ = [("cpumask", ctypes.c_bool * MAX_THREADS), ("n_threads", ctypes.c_int), ("prio", ctypes.c_int),
                ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool), ("paused", ctypes.c_bool)]


@cache
def _ggml() -> ctypes.CDLL:
    pointer = ctypes.c_void_p
    for name, argtypes, restype in (
        ("ggml_threadpool_params_init", [ctypes.POINTER(ThreadpoolParams), ctypes.c_int], None),
        ("ggml_threadpool_params_match", [ctypes.POINTER(ThreadpoolParams)] * 2, ctypes.c_bool),
        ("ggml_threadpool_new", [ctypes.POINTER(ThreadpoolParams)], pointer),
        ("ggml_threadpool_free", [pointer], None),
    ):
        function = getattr(libggml, name)
        function.argtypes, function.restype = argtypes, restype
    for name, argtypes in (("llama_attach_threadpool", [pointer, pointer, pointer]),
                           ("llama_detach_threadpool", [pointer])):
        function = getattr(llama_lib._lib, name)
        function.argtypes, function.restype = argtypes, None
    return libggml


def pool_params(cpu: CpuParams, n_threads: int) -> ThreadpoolParams:
    """ggml's defaults for `n_threads`, then the flags (common's ggml_threadpool_params_from_cpu_params)."""
    params = ThreadpoolParams()
    _ggml().ggml_threadpool_params_init(ctypes.byref(params), n_threads)
    for index in cpu.cpus:
        params.cpumask[index] = True
    params.prio, params.poll, params.strict_cpu = cpu.priority, cpu.poll, cpu.strict
    return params


def attach_threadpools(ctx: LlamaContext, cpu: CpuParams, cpu_batch: CpuParams, n_threads: int,
                       n_threads_batch: int) -> None:
    """Gives the context pools made with the flags (a batch pool only when it differs, the generation pool
    then starting paused, as llama.cpp's common_threadpools::init does). They are detached and freed just
    before the context itself is freed."""
    if cpu.is_default and cpu_batch.is_default:
        return
    set_process_priority(cpu.priority)
    ggml = _ggml()
    params, params_batch = pool_params(cpu, n_threads), pool_params(cpu_batch, n_threads_batch)
    for pool, name in ((params, "generation"), (params_batch, "prompt")):
        wanted = sum(pool.cpumask)
        if wanted and wanted < pool.n_threads:
            log.warning("not enough CPUs in the mask (%d) for %d %s threads", wanted, pool.n_threads, name)
    batch_pool = None
    if not ggml.ggml_threadpool_params_match(ctypes.byref(params), ctypes.byref(params_batch)):
        batch_pool = ggml.ggml_threadpool_new(ctypes.byref(params_batch))
        if not batch_pool:
            raise RuntimeError(f"llama.cpp could not make a thread pool of {n_threads_batch} threads (batch)")
        params.paused = True
    pool = ggml.ggml_threadpool_new(ctypes.byref(params))
    if not pool:
        if batch_pool:
            ggml.ggml_threadpool_free(batch_pool)
        raise RuntimeError(f"llama.cpp could not make a thread pool of {n_threads} threads")
    llama_lib._lib.llama_attach_threadpool(ctx.ctx, pool, batch_pool)

    def detach_and_free() -> None:
        if ctx.ctx is not None:
            llama_lib._lib.llama_detach_threadpool(ctx.ctx)
        ggml.ggml_threadpool_free(pool)
        if batch_pool:
            ggml.ggml_threadpool_free(batch_pool)

    # ExitStack runs its callbacks last in, first out: this one before the context is freed
    ctx._exit_stack.callback(detach_and_free)


def set_process_priority(priority: int) -> None:
    """--prio for the whole process, as llama.cpp sets it (POSIX nice values; raising needs privileges)."""
    if priority == 0 or not hasattr(os, "setpriority"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE[priority])
    except OSError as exc:
        log.warning("failed to set process priority %s: %s", PRIORITIES[priority], exc)
