"""The GPU run's results in one JSON and one Markdown table, from bench_streams.py's --json files.

Beside the bench's own figures it adds what only the GPU machine knows:
- the bound: the tokens per second at which the model's weights would be read once per decode step at the
  card's memory bandwidth. A step decodes one token of every stream, so at n streams the bound is
  n x bandwidth / weight bytes, and a server's fraction of it is its aggregate tokens/s over that. The
  bandwidth is 2 x the memory's top clock x its bus width (NVML, the library nvidia-smi reads), or else
  the datasheet figure of a known card; the weight bytes are the GGUF's tensor data.
- the GPU's utilization, memory and power in each phase (nvidia-smi sampled every 500 ms by run.sh).

    python bench/gpu/report.py --out DIR --model M.gguf --streams S.json [--classroom C.json]
        [--class-size Z.json] [--gpu-csv gpu.csv --phases phases.tsv] [--commit SHA] [--note TEXT]
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import datetime as dt
import json
import math
import mmap
import os
import statistics
import struct
import subprocess
from pathlib import Path
from typing import Any

# Datasheet memory bandwidth (bytes/s) by a substring of the name nvidia-smi reports, most specific
# first: used only where NVML cannot give the clock and bus width.
DATASHEET_BANDWIDTH = [
    ("H200", 4.8e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),  # SXM5
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),  # 40 GB
    ("L40S", 0.864e12),
    ("L4", 0.300e12),
]
NVML_CLOCK_MEM = 2  # nvmlClockType_t


def gguf_tensor_bytes(path: Path) -> int:
    """The size of a GGUF's tensor data: the file from the aligned end of its tensor infos on. Reads the
    header by hand (the gguf package's reader takes seconds over a 262k-token vocabulary)."""
    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type: bytes
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
        at = 24

        def string() -> bytes:
            nonlocal at
            (length,) = struct.unpack_from("<Q", data, at)
            at += 8 + length
            return data[at - length:at]

        def skip(kind: int) -> int | None:
            """Moves past one value of GGUF type `kind`; returns it when it is an unsigned integer."""
            nonlocal at
            if kind == 8:
                string()
            elif kind == 9:
                item, count = struct.unpack_from("<IQ", data, at)
                at += 12
                if item in scalar:
                    at += scalar[item] * count
                else:
                    for _ in range(count):
                        skip(item)
            else:
                value = int.from_bytes(data[at:at + scalar[kind]], "little") if kind in (4, 10) else None
                at += scalar[kind]
                return value
            return None

        alignment = 32
        for _ in range(n_kv):
            key = string()
            (kind,) = struct.unpack_from("<I", data, at)
            at += 4
            value = skip(kind)
            if key == b"general.alignment" and value:
                alignment = value
        for _ in range(n_tensors):
            string()
            (n_dims,) = struct.unpack_from("<I", data, at)
            at += 4 + 8 * n_dims + 4 + 8  # dims, type, offset
        start = -(-at // alignment) * alignment
        return len(data) - start


def nvidia_smi(*fields: str) -> list[str] | None:
    """The first GPU's values of `fields` (nvidia-smi --query-gpu), or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.strip().splitlines()
    return [v.strip() for v in lines[0].split(",")] if lines else None


def nvml_memory() -> tuple[int, int] | None:
    """(top memory clock MHz, bus width bits) of GPU 0 through NVML, or None where it cannot say."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        handle = ctypes.c_void_p()
        clock, width = ctypes.c_uint(), ctypes.c_uint()
        if (nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) != 0
                or nvml.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_MEM, ctypes.byref(clock)) != 0
                or nvml.nvmlDeviceGetMemoryBusWidth(handle, ctypes.byref(width)) != 0):
            return None
        return (clock.value, width.value) if clock.value and width.value else None
    except AttributeError:  # a driver too old for one of the calls
        return None
    finally:
        nvml.nvmlShutdown()


def gpu_memory_bandwidth() -> dict[str, Any] | None:
    """GPU 0's name and memory bandwidth (bytes/s) with where the figure comes from; None without a GPU."""
    found = nvidia_smi("name", "memory.total", "driver_version")
    if found is None:
        return None
    name, memory_mib, driver = found
    gpu: dict[str, Any] = {"name": name, "memory MiB": memory_mib, "driver": driver}
    datasheet = next((bw for key, bw in DATASHEET_BANDWIDTH if key.lower() in name.lower()), None)
    if datasheet is not None:
        gpu["datasheet bandwidth B/s"] = datasheet
    measured = nvml_memory()
    if measured is not None:
        clock_mhz, bus_bits = measured
        gpu["bandwidth B/s"] = 2 * clock_mhz * 1e6 * bus_bits / 8  # two transfers a clock
        gpu["bandwidth source"] = f"NVML: 2 x {clock_mhz} MHz x {bus_bits}-bit bus"
    elif datasheet is not None:
        gpu["bandwidth B/s"] = datasheet
        gpu["bandwidth source"] = f"datasheet figure for {name}"
    return gpu


def utilization(gpu_csv: Path, phases: Path) -> list[dict[str, Any]]:
    """nvidia-smi's samples (timestamp, utilization %, memory MiB, SM clock, power W) summed up per phase
    (phases.tsv: name, start and end as Unix times); nvidia-smi writes local time, read here as local."""
    samples = []
    with gpu_csv.open() as f:
        for row in csv.reader(f):
            try:
                stamp = dt.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                util, memory = float(row[1]), float(row[2])
            except (ValueError, IndexError):
                continue  # the header, or "[N/A]"
            try:
                power = float(row[4])
            except (ValueError, IndexError):
                power = math.nan  # a card that does not report it
            samples.append((stamp, util, memory, power))
    summary = []
    for line in phases.read_text().splitlines():
        name, start, end = line.split("\t")
        inside = [s for s in samples if float(start) <= s[0] <= float(end)]
        if not inside:
            continue
        busy = sorted(s[1] for s in inside)
        summary.append({"phase": name, "samples": len(inside), "utilization % mean": statistics.fmean(busy),
                        "utilization % p95": busy[min(len(busy) - 1, int(0.95 * len(busy)))],
                        "utilization % max": busy[-1], "memory MiB max": max(s[2] for s in inside),
                        "power W mean": statistics.fmean(s[3] for s in inside)})  # NaN when not reported
    return summary


def bound_rows(streams: dict[str, Any], weight_bytes: int, bandwidth: float | None) -> list[dict[str, Any]]:
    """Each streams row's time a step, and its fraction of the bound where the bandwidth is known."""
    rows = []
    for row in streams["rows"]:
        n, aggregate = row["streams"], row["aggregate tok/s"]
        entry: dict[str, Any] = {"server": row["server"], "streams": n, "aggregate tok/s": aggregate,
                                 "ms a step": 1000 * n / aggregate if aggregate else None}
        if bandwidth:
            bound = n * bandwidth / weight_bytes
            entry["bound tok/s"] = bound
            entry["fraction of bound"] = aggregate / bound if aggregate else None
        rows.append(entry)
    return rows


def cell(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(results: dict[str, Any]) -> str:
    gpu, model = results.get("gpu"), results["model"]
    lines = [f"# kinetic beside llama-server on {gpu['name'] if gpu else 'the CPU (no GPU)'}", "",
             f"{results['date']}, commit {results['commit']}. {results['note']}".rstrip(), "",
             f"- model: {model['path']} ({model['weight bytes'] / 1e9:.2f} GB of weights)"]
    if gpu and gpu.get("bandwidth B/s"):
        read_ms = 1000 * model["weight bytes"] / gpu["bandwidth B/s"]
        lines.append(f"- memory bandwidth: {gpu['bandwidth B/s'] / 1e12:.2f} TB/s ({gpu['bandwidth source']}): "
                     f"the weights read once in {read_ms:.3f} ms, a bound of {1000 / read_ms:.0f} tok/s a stream")
    streams = results.get("streams")
    if streams:
        by = {(r["server"], r["streams"]): r for r in streams["rows"]}
        bound = {(r["server"], r["streams"]): r for r in results["bound"]}
        counts = sorted({r["streams"] for r in streams["rows"]})
        lines += ["", f"## Streams ({streams['tokens']} tokens each, median of {streams['rounds']} rounds)", "",
                  "| streams | kinetic tok/s | llama-server tok/s | aggregate ratio | TTFT p50 ms, kinetic / "
                  "llama-server | ms a step, kinetic / llama-server | kinetic, of the bound | llama-server, of "
                  "the bound |", "|---|---|---|---|---|---|---|---|"]
        for n in counts:
            k, ls = by.get(("kinetic", n), {}), by.get(("llama-server", n), {})
            kb, lb = bound.get(("kinetic", n), {}), bound.get(("llama-server", n), {})
            ka, la = k.get("aggregate tok/s"), ls.get("aggregate tok/s")
            ratio = ka / la if ka and la else None
            lines.append(f"| {n} | {cell(ka)} | {cell(la)} | {cell(ratio, 2)} | {cell(k.get('TTFT p50 ms'))} / "
                         f"{cell(ls.get('TTFT p50 ms'))} | {cell(kb.get('ms a step'), 2)} / "
                         f"{cell(lb.get('ms a step'), 2)} | {percent(kb.get('fraction of bound'))} | "
                         f"{percent(lb.get('fraction of bound'))} |")
    for key, title in (("classroom", "Classroom"), ("class-size", "Class size")):
        part = results.get(key)
        if not part:
            continue
        headers = list(part["rows"][0]) if part["rows"] else []
        lines += ["", f"## {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(cell(row[h], 1) for h in headers) + " |" for row in part["rows"]]
        if "TTFT p95 ratio" in part:
            lines.append(f"\nkinetic/llama-server TTFT p95: {part['TTFT p95 ratio']:.2f}")
        if "largest class" in part:
            lines.append("\nlargest class: " + ", ".join(f"{k} {v}" for k, v in part["largest class"].items()))
    if results.get("gpu utilization"):
        lines += ["", "## GPU utilization (nvidia-smi every 500 ms)", "",
                  "| phase | samples | mean % | p95 % | max % | memory MiB max | power W mean |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {u['phase']} | {u['samples']} | {u['utilization % mean']:.0f} | {u['utilization % p95']:.0f} "
                  f"| {u['utilization % max']:.0f} | {u['memory MiB max']:.0f} | {cell(u['power W mean'])} |"
                  for u in results["gpu utilization"]]
    return "\n".join(lines) + "\n"


def percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def load(path: Path | None) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path and path.is_file() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json and results.md")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--streams", type=Path)
    parser.add_argument("--classroom", type=Path)
    parser.add_argument("--class-size", type=Path)
    parser.add_argument("--gpu-csv", type=Path)
    parser.add_argument("--phases", type=Path)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    gpu = gpu_memory_bandwidth()
    weight_bytes = gguf_tensor_bytes(args.model)
    streams = load(args.streams)
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": args.commit, "note": args.note,
        "cores": os.cpu_count(), "gpu": gpu,
        "model": {"path": str(args.model), "weight bytes": weight_bytes, "file bytes": args.model.stat().st_size},
        "streams": streams, "classroom": load(args.classroom), "class-size": load(args.class_size),
        "bound": bound_rows(streams, weight_bytes, gpu.get("bandwidth B/s") if gpu else None) if streams else [],
        "gpu utilization": (utilization(args.gpu_csv, args.phases)
                            if args.gpu_csv and args.phases and args.gpu_csv.is_file() and args.phases.is_file()
                            else []),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    text = markdown(results)
    (args.out / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
