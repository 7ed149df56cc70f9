"""One server started alone with its log kept (the bench discards both servers' output): it must become
healthy and answer a short completion twice (the first warms up). Prints the time to healthy, the second
answer's time and timings, /props's device fields, and the log's lines about the backend, offload, buffers
and errors, so a run whose server fell back to the CPU, or failed, says so before the bench starts.

    python bench/gpu/preflight.py NAME LOGFILE COMMAND...   # --host and --port are added; exit 1 on failure
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kinetic.server.launch import free_port, model_lock, stop_process, wait_until_healthy  # noqa: E402

# what llama.cpp (and kinetic, which logs the same at start) say about where the model runs
LOG_LINES = re.compile(r"offload|CUDA|GPU|using device|backends|error|failed|fatal|flash_attn|n_ctx |n_seq_max|"
                       r"n_parallel|buffer size|uvloop", re.IGNORECASE)
NOISE = re.compile(r"assigned to device|llama_graph_n_input_tensors")  # a line per layer or graph node
PROMPT = "The history of the printing press begins"


def check(name: str, url: str) -> bool:
    """Two short greedy completions; True when the second answered 200."""
    body = {"prompt": PROMPT, "max_tokens": 32, "ignore_eos": True, "temperature": 0}
    for _ in range(2):
        started = time.perf_counter()
        response = httpx.post(url + "/v1/completions", json=body, timeout=120)
        took = time.perf_counter() - started
    print(f"{name}: /v1/completions {response.status_code} in {1000 * took:.0f} ms")
    if response.status_code != 200:
        print(f"{name}: {response.text[:500]}")
        return False
    data = response.json()
    print(f"{name}: usage {data.get('usage')} timings {data.get('timings')}")
    props = httpx.get(url + "/props", timeout=10).json()
    placed = props.get("offload")  # kinetic's: where llama.cpp put the model (llama-server only logs it)
    where = (f"; offloaded {placed['layers_offloaded']}/{placed['layers']} layers, running on "
             + ", ".join(f"{d['name']} ({d['description']})" for d in placed["devices"]) if placed else "")
    print(f"{name}: /props total_slots={props.get('total_slots')}{where}")
    return True


def main() -> int:
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    name, logfile, command = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ok = False
    with model_lock(), logfile.open("w") as log:
        started = time.perf_counter()
        proc = subprocess.Popen([*command, "--host", "127.0.0.1", "--port", str(port)], stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            failure = wait_until_healthy(proc, url, 90)
            if failure is not None:
                print(f"{name}: {failure}")
            else:
                print(f"{name}: healthy after {time.perf_counter() - started:.1f} s")
                ok = check(name, url)
        except (httpx.HTTPError, ValueError) as exc:
            print(f"{name}: request failed: {type(exc).__name__} {exc}")
        finally:
            stop_process(proc)
    lines = logfile.read_text(errors="replace").splitlines()
    picked = [line for line in lines if LOG_LINES.search(line) and not NOISE.search(line)]
    print(f"{name}: {len(lines)} log lines; those about the backend, offload, buffers and errors (first 40):")
    for line in picked[:40]:
        print("   ", line[:300])
    if not ok:
        print(f"{name}: the log's last 30 lines:")
        for line in lines[-30:]:
            print("   ", line[:300])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
