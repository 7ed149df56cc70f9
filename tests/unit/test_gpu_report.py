"""bench/gpu/report.py's arithmetic, which only runs for real on a GPU machine: the GGUF's weight bytes, the
bound and each server's fraction of it, nvidia-smi's samples summed up per phase, and the Markdown table."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.hybrid_model import write_gguf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gpu"))

import report  # noqa: E402


def test_the_weight_bytes_are_the_tensor_data_after_the_header(tmp_path: Path) -> None:
    import gguf

    def fill(writer: Any) -> None:
        writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(1000)])  # an array of strings to skip
        writer.add_tensor("a", np.ones((3, 5), dtype=np.float32))
        writer.add_tensor("b", np.ones(7, dtype=np.float16))

    path = write_gguf(tmp_path / "m.gguf", "llama", "m", fill)
    reader = gguf.GGUFReader(str(path))
    assert report.gguf_tensor_bytes(path) == path.stat().st_size - reader.data_offset
    assert report.gguf_tensor_bytes(path) >= sum(int(t.n_bytes) for t in reader.tensors) == 60 + 14


def test_each_server_gets_its_fraction_of_the_bound() -> None:
    streams = {"rows": [{"server": "kinetic", "streams": 1, "aggregate tok/s": 400.0},
                        {"server": "llama-server", "streams": 32, "aggregate tok/s": 3200.0}]}
    rows = report.bound_rows(streams, weight_bytes=10**9, bandwidth=4e12)  # 4000 steps/s
    assert rows[0]["bound tok/s"] == 4000 and rows[0]["fraction of bound"] == pytest.approx(0.1)
    assert rows[1]["bound tok/s"] == 32 * 4000 and rows[1]["ms a step"] == pytest.approx(10.0)
    assert "bound tok/s" not in report.bound_rows(streams, weight_bytes=10**9, bandwidth=None)[0]


def test_nvidia_smi_samples_are_summed_per_phase(tmp_path: Path) -> None:
    start = dt.datetime(2026, 12, 4, 17, 0, 0)

    def at(seconds: float) -> str:
        return (start + dt.timedelta(seconds=seconds)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]

    csv = ["timestamp, utilization.gpu [%], memory.used [MiB], clocks.current.sm [MHz], power.draw [W]"]
    csv += [f"{at(t)}, {busy}, {1000 + t}, 1980, [N/A]" for t, busy in ((0, 0), (1, 20), (2, 40), (5, 90))]
    (tmp_path / "gpu.csv").write_text("\n".join(csv) + "\n")
    (tmp_path / "phases.tsv").write_text(f"streams\t{start.timestamp() + 0.5}\t{start.timestamp() + 2.5}\n"
                                         f"classroom\t{start.timestamp() + 10}\t{start.timestamp() + 11}\n")
    [streams] = report.utilization(tmp_path / "gpu.csv", tmp_path / "phases.tsv")  # no sample in classroom
    assert (streams["phase"], streams["samples"], streams["utilization % mean"], streams["utilization % max"],
            streams["memory MiB max"]) == ("streams", 2, 30, 40, 1002)


def test_the_markdown_shows_both_servers_and_the_bound(tmp_path: Path) -> None:
    rows = [{"server": name, "streams": 4, "aggregate tok/s": tps, "TTFT p50 ms": ttft}
            for name, tps, ttft in (("kinetic", 1200.0, 57.0), ("llama-server", 450.0, 115.0))]
    results = {"date": "2026-12-04 18:00 UTC", "commit": "abc clean", "note": "-ngl 99",
               "gpu": {"name": "NVIDIA H200", "bandwidth B/s": 4.8e12, "bandwidth source": "datasheet"},
               "model": {"path": "m.gguf", "weight bytes": 8 * 10**8},
               "streams": {"tokens": 256, "rounds": 2, "rows": rows},
               "bound": report.bound_rows({"rows": rows}, 8 * 10**8, 4.8e12), "gpu utilization": []}
    text = report.markdown(results)
    assert "| 4 | 1200 | 450 | 2.67 | 57 / 115 | 3.33 / 8.89 | 5.0% | 1.9% |" in text
    assert "a bound of 6000 tok/s a stream" in text
