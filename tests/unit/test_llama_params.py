"""llama-server's model and context flags reach llama.cpp's llama_model_params and llama_context_params
(kinetic.engine.llama.params), GPU-only ones included: read back from the structs that are built."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp
import pytest

from kinetic.config.args import parse_serve_args
from kinetic.config.settings import ServerSettings, SettingsError
from kinetic.engine.llama import devices, params
from kinetic.engine.llama.params import context_params, model_params
from kinetic.engine.options import CpuParams, EngineConfig, LlamaOptions, parse_cpu_mask, parse_kv_override


def options(*argv: str) -> LlamaOptions:
    return parse_serve_args(list(argv), environ={}).llama_options()


def test_without_flags_the_params_are_llama_cpps_defaults_but_repack() -> None:
    built = model_params(LlamaOptions()).params
    default = llama_cpp.llama_model_default_params()
    for name in ("n_gpu_layers", "split_mode", "main_gpu", "load_mode", "lazy_mode", "check_tensors", "no_host"):
        assert getattr(built, name) == getattr(default, name), name
    assert not built.use_extra_bufts  # kinetic's default, unlike llama.cpp's (params.model_params)
    assert not built.kv_overrides and not built.tensor_split
    ctx = context_params(LlamaOptions(), n_ctx=1024, n_batch=2048, n_ubatch=512, n_seq_max=4, n_threads=2,
                         kv_unified=False)
    default_ctx = llama_cpp.llama_context_default_params()
    for name in ("flash_attn_type", "type_k", "type_v", "offload_kqv", "op_offload", "rope_scaling_type",
                 "rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_slow",
                 "yarn_beta_fast", "yarn_orig_ctx"):
        assert getattr(ctx, name) == getattr(default_ctx, name), name
    assert (ctx.n_ctx, ctx.n_batch, ctx.n_ubatch, ctx.n_seq_max, ctx.n_threads, ctx.n_threads_batch) == \
        (1024, 1024, 512, 4, 2, 2)
    assert ctx.swa_full and ctx.no_perf and not ctx.kv_unified


def test_gpu_flags_reach_the_model_params() -> None:
    built = model_params(options("-ngl", "99", "-sm", "row", "-mg", "1", "-ts", "3,1", "--no-repack", "--no-host",
                                 "--check-tensors", "-lzm", "on"))
    p = built.params
    assert (p.n_gpu_layers, p.split_mode, p.main_gpu) == (99, llama_cpp.LLAMA_SPLIT_MODE_ROW, 1)
    assert [p.tensor_split[i] for i in range(3)] == [3.0, 1.0, 0.0]
    assert (p.use_extra_bufts, p.no_host, p.check_tensors, p.lazy_mode) == (False, True, True,
                                                                            llama_cpp.LLAMA_LAZY_MODE_ON)
    assert model_params(options("-ngl", "all")).params.n_gpu_layers == -2
    assert model_params(options("-ngl", "auto")).params.n_gpu_layers == -1


@pytest.mark.parametrize(("argv", "mode"), [
    ([], llama_cpp.LLAMA_LOAD_MODE_AUTO),
    (["--load-mode", "dio"], llama_cpp.LLAMA_LOAD_MODE_DIRECT_IO),
    (["--no-mmap"], llama_cpp.LLAMA_LOAD_MODE_NONE),
    (["--mlock"], llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK),
    (["--no-mmap", "--mlock"], llama_cpp.LLAMA_LOAD_MODE_MLOCK),
    (["--mmap"], llama_cpp.LLAMA_LOAD_MODE_AUTO),
])
def test_load_mode_and_the_older_mmap_switches(argv: list[str], mode: int) -> None:
    assert model_params(options(*argv)).params.load_mode == mode


def test_metadata_overrides_are_a_null_terminated_array() -> None:
    built = model_params(options("--override-kv", "tokenizer.ggml.add_bos_token=bool:false,a.b=int:7",
                                 "--override-kv", "c.d=float:0.5", "--override-kv", "e.f=str:hi"))
    array = ctypes.cast(built.params.kv_overrides, ctypes.POINTER(llama_cpp.llama_model_kv_override))
    read = [(array[i].key, array[i].tag) for i in range(5)]
    assert read == [(b"tokenizer.ggml.add_bos_token", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_BOOL),
                    (b"a.b", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT), (b"c.d", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_FLOAT),
                    (b"e.f", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR), (b"", 0)]
    assert array[0].value.val_bool is False and array[1].value.val_i64 == 7 and array[2].value.val_f64 == 0.5
    assert array[3].value.val_str == b"hi"


@pytest.mark.parametrize(("value", "message"), [
    ("nokey", "expected KEY=TYPE:VALUE"), ("k=float:x", "'x' is not a float"), ("k=bool:yes", "not a bool"),
    ("k=list:1", "the type must be one of"),
])
def test_bad_overrides_are_refused_naming_the_flag(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_kv_override(value)
    with pytest.raises(SettingsError, match="for --override-kv"):
        options("--override-kv", value)


def test_context_flags_reach_the_context_params() -> None:
    ctx = context_params(options("-fa", "on", "-ctk", "q8_0", "-ctv", "q4_0", "-nkvo", "--no-op-offload", "-tb", "3",
                                 "--rope-scaling", "yarn", "--rope-freq-base", "20000", "--rope-scale", "4",
                                 "--yarn-orig-ctx", "4096", "--yarn-ext-factor", "0.5", "--yarn-attn-factor", "1.5",
                                 "--yarn-beta-slow", "2", "--yarn-beta-fast", "16"),
                         n_ctx=512, n_batch=64, n_ubatch=512, n_seq_max=1, n_threads=2, kv_unified=True)
    assert ctx.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    assert (ctx.type_k, ctx.type_v) == (llama_cpp.GGML_TYPE_Q8_0, llama_cpp.GGML_TYPE_Q4_0)
    assert (ctx.offload_kqv, ctx.op_offload, ctx.n_threads, ctx.n_threads_batch) == (False, False, 2, 3)
    assert ctx.rope_scaling_type == llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN and ctx.rope_freq_base == 20000
    assert ctx.rope_freq_scale == 0.25 and ctx.yarn_orig_ctx == 4096  # --rope-scale N is a frequency scale of 1/N
    assert (ctx.yarn_ext_factor, ctx.yarn_attn_factor, ctx.yarn_beta_slow, ctx.yarn_beta_fast) == (0.5, 1.5, 2, 16)
    assert (ctx.n_batch, ctx.n_ubatch, ctx.kv_unified) == (64, 64, True)
    assert context_params(options("-fa", "off"), n_ctx=512, n_batch=512, n_ubatch=512, n_seq_max=1, n_threads=1,
                          kv_unified=False).flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED


def test_kv_unified_overrides_the_slot_rule() -> None:
    assert options().kv_unified is None
    assert options("-kvu").kv_unified is True and options("-no-kvu").kv_unified is False
    assert parse_serve_args([], environ={"LLAMA_ARG_KV_UNIFIED": "1"}).llama_options().kv_unified is True


def test_special_numa_and_describe() -> None:
    chosen = options("--special", "--numa", "isolate", "-ctk", "q8_0", "--override-kv", "x.y=bool:true")
    assert chosen.special and chosen.numa == "isolate"
    shown = chosen.describe()
    assert shown["cache_type_k"] == "q8_0" and shown["kv_overrides"] == ["x.y=bool:true"]
    assert shown["n_gpu_layers"] == -1 and shown["flash_attn"] == "auto"


@pytest.mark.parametrize(("argv", "message"), [
    (["-ngl", "many"], "for -ngl: expected a number of layers, auto or all"),
    (["-ctk", "q9"], "for -ctk: expected one of"),
    (["-fa", "maybe"], "for -fa: expected one of"),
    (["-ts", "3,x"], "for -ts: expected proportions"),
    (["--numa", "all"], "for --numa: expected one of"),
])
def test_bad_values_stop_the_start_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        options(*argv)


def test_the_engine_takes_the_options() -> None:
    from kinetic.engine.llama import LlamaEngine

    chosen = ServerSettings(kv_unified=True, parallel=2).llama_options()
    engine = LlamaEngine(Path("none.gguf"), EngineConfig(n_parallel=2, options=chosen))
    assert engine.kv_unified and engine.options is chosen
    assert not LlamaEngine(Path("none.gguf"), EngineConfig(n_parallel=2)).kv_unified


def test_list_devices_prints_and_exits(capsys: pytest.CaptureFixture[str]) -> None:
    from kinetic.cli import main

    assert main(["serve", "--list-devices", "-m", "/no/such.gguf"]) == 0  # exits before any model is read
    out = capsys.readouterr().out
    assert out.startswith("Available devices:\n")
    offload = [d for d in devices.devices() if d.type != "CPU"]  # ggml's registry: the CPU is never listed
    assert out.count("\n  ") == max(len(offload), 1) and ("(none)" in out) == (not offload)


def test_tensor_overrides_reach_the_model_params_as_a_null_terminated_array() -> None:
    """-ot, --cpu-moe, --n-cpu-moe and --n-cpu-ffn become llama.cpp's (pattern, buffer type) list, in its order."""
    chosen = options("-ot", r"blk\.0\.attn_q=CPU,token_embd=CPU", "--cpu-moe", "-ncmoe", "2", "-ncffn", "1")
    patterns = [pattern for pattern, _ in chosen.tensor_overrides]
    assert patterns == [r"blk\.0\.attn_q", "token_embd", devices.FFN_EXPERTS_PATTERN,
                        rf"blk\.0{devices.FFN_EXPERTS_PATTERN}", rf"blk\.1{devices.FFN_EXPERTS_PATTERN}",
                        rf"blk\.0{devices.FFN_DENSE_PATTERN}"]
    built = model_params(chosen)
    array = ctypes.cast(built.params.tensor_buft_overrides, ctypes.POINTER(devices.TensorBufferOverride))
    cpu = devices.buffer_types()["CPU"]
    assert [array[i].pattern.decode() for i in range(6)] == patterns and array[6].pattern is None
    assert {array[i].buft for i in range(6)} == {cpu} and not array[6].buft
    assert chosen.describe()["tensor_overrides"][0] == r"blk\.0\.attn_q=CPU"
    assert not model_params(options()).params.tensor_buft_overrides


def test_device_none_is_an_empty_null_terminated_list() -> None:
    """-dev none: no offload (llama.cpp reads a list holding only NULL); no -dev: NULL, every device."""
    built = model_params(options("-dev", "none"))
    array = ctypes.cast(built.params.devices, ctypes.POINTER(ctypes.c_void_p))
    assert array[0] is None and options("-dev", "none").describe()["devices"] == []
    assert not model_params(options()).params.devices


@pytest.mark.parametrize(("argv", "message"), [
    (["-dev", "CUDA7"], "for -dev: invalid device: CUDA7"),
    (["-ot", "token_embd=VRAM9"], "for -ot: unknown buffer type 'VRAM9' \\(available: .*CPU"),
    (["-ot", "token_embd"], "for -ot: 'token_embd' is not <tensor name pattern>=<buffer type>"),
    (["-ncmoe", "-1"], "for -ncmoe"),
])
def test_bad_device_and_override_values_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        options(*argv)


def test_on_a_cpu_with_amx_the_weights_stay_off_the_extra_buffer_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """ggml's AMX kernels crash the natively built llama.cpp on the bundled Gemma (model_params)."""
    monkeypatch.setattr(params, "cpu_has_amx", lambda: True)
    assert not model_params(LlamaOptions(repack=True)).params.use_extra_bufts
    monkeypatch.setattr(params, "cpu_has_amx", lambda: False)
    assert model_params(LlamaOptions(repack=True)).params.use_extra_bufts


def test_cpu_flags_build_llama_cpps_thread_pool_params() -> None:
    """-C and -Cr add up; each -batch flag not given takes the generation one's value; the pool params are
    ggml's defaults for the thread count, then the flags (llama.cpp's ggml_threadpool_params_from_cpu_params)."""
    from kinetic.engine.llama.threads import pool_params

    chosen = options("-C", "0x5", "-Cr", "8-9", "--cpu-strict", "1", "--prio", "2", "--poll", "0", "-Crb", "1-1",
                     "--poll-batch", "100")
    assert chosen.cpu == CpuParams(cpus=(0, 2, 8, 9), strict=True, priority=2, poll=0)
    assert chosen.cpu_batch == CpuParams(cpus=(1,), strict=True, priority=2, poll=100)
    built = pool_params(chosen.cpu, 3)
    assert [i for i in range(512) if built.cpumask[i]] == [0, 2, 8, 9]
    assert (built.n_threads, built.prio, built.poll, built.strict_cpu, built.paused) == (3, 2, 0, True, False)
    unpinned = options("--cpu-strict", "0")  # llama-server's default, given: llama.cpp makes its own pools
    assert unpinned.cpu.is_default and unpinned.cpu_batch.is_default
    prio_batch = options("--cpu-strict", "0", "--prio-batch", "1")
    assert prio_batch.cpu.is_default and not prio_batch.cpu_batch.is_default


def test_threads_as_many_as_the_cpus_get_one_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without -C/-Cr or --cpu-strict, threads that fill the CPUs are pinned one per CPU (`-C <all> --cpu-strict 1`);
    fewer threads, or --cpu-strict 0, are left to the kernel, as llama-server leaves them."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    pinned = CpuParams(cpus=(0, 1, 2, 3), strict=True)
    assert options().cpu == pinned and options().cpu_batch == pinned  # -t's default: the CPUs
    assert options("-t", "4").cpu == pinned and options("-t", "2").cpu.is_default
    assert options("-t", "2", "-tb", "4").cpu.is_default and options("-t", "2", "-tb", "4").cpu_batch == pinned
    assert options("--cpu-strict", "0").cpu.is_default
    assert options("-C", "0x3").cpu == CpuParams(cpus=(0, 1))  # a mask given: placed as it says
    assert options("--cpu-strict-batch", "0").cpu == pinned and options("--cpu-strict-batch", "0").cpu_batch.is_default
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert options().cpu.is_default  # one CPU: nothing to place


@pytest.mark.parametrize(("mask", "cpus"), [("0x1", (0,)), ("F0", (4, 5, 6, 7)), ("0x100", (8,)), ("0", ())])
def test_cpu_masks_read_as_llama_cpp_reads_them(mask: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpu_mask(mask) == cpus


@pytest.mark.parametrize(("argv", "message"), [
    (["-C", "0xZZ"], "for -C: '0xZZ' is not a hex CPU mask"),
    (["-Cr", "5-2"], "for -Cr: '5-2' is not a CPU range"),
    (["-Cr", "4"], "for -Cr: '4' is not a CPU range"),
    (["--prio", "4"], "for --prio"),
    (["--prio-batch", "-1"], "for --prio-batch"),
    (["--poll", "101"], "for --poll"),
    (["--cpu-strict", "2"], "for --cpu-strict"),
])
def test_bad_cpu_flags_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        options(*argv)
