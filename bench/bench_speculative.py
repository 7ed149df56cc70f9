"""Speculative decoding: generation tokens/s with and without it, kinetic beside llama-server, same flags.

Seven settings on each server: none; `--spec-type ngram-simple` (drafts from the slot's own history) and the
other n-gram kinds (ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache), each with llama-server's default sizes;
`-md MODEL --spec-type draft-simple` (the bundled model as its own draft, llama-server's default 3 tokens a
step). Two requests: a repetitive output (a base-model completion that repeats one sentence, greedy, where
drafts are accepted) and the lab's request (lab 04-02's chat.py: its system and user message, 80 tokens;
greedy and to the end, so that both servers write the same 80 tokens). Each is sent `--rounds` times; the
table shows the median of
the servers' own `predicted_per_second`, `draft_n_accepted / draft_n`, and the ratios: with / without
speculation on the same server, and kinetic / llama-server for the same setting. Servers take turns.

    flock /tmp/kinetic-tests-model.lock python bench/bench_speculative.py [--llama-server PATH] [--rounds 3]

llama-server comes from --llama-server, PATH, or /tmp/lsbuild/bin/llama-server; on a CPU with AMX it runs
with --no-repack (its repacked AMX kernels crash on the bundled model), and kinetic gets the same flag.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from load import Server, kinetic_server, llama_server, table  # noqa: E402

from kinetic.backends.bundled import gemma_model_path  # noqa: E402

SENTENCE = "The little robot walks to the old market and buys three red apples for its friend."
REPETITIVE = {"prompt": " ".join([SENTENCE] * 6), "n_predict": 128, "temperature": 0, "ignore_eos": True}
LAB = {"model": "local", "max_tokens": 80, "temperature": 0, "ignore_eos": True,
       "chat_template_kwargs": {"enable_thinking": False},
       "messages": [{"role": "system", "content": "Rispondi in italiano, in modo breve."},
                    {"role": "user", "content": "Che cos'è llama.cpp?"}]}
REQUESTS = {"repetitive output": ("/completion", REPETITIVE), "lab 04-02 request": ("/v1/chat/completions", LAB)}
COMMON = ["-c", "4096", "-np", "1", "--no-repack", "--chat-template", "gemma"]


def settings(model: str) -> dict[str, list[str]]:
    kinds = {"none": [], "ngram-simple": ["--spec-type", "ngram-simple"]}
    kinds |= {kind: ["--spec-type", kind] for kind in ("ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")}
    return kinds | {"draft-simple (-md itself)": ["-md", model, "--spec-type", "draft-simple"]}


def measure(server: Server, rounds: int) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    with httpx.Client(timeout=600) as client:
        for name, (path, body) in REQUESTS.items():
            speeds, drafted, accepted = [], 0, 0
            client.post(server.url + path, json={**body, **({"n_predict": 4} if "prompt" in body else
                                                            {"max_tokens": 4})})  # warm-up
            for _ in range(rounds):
                reply = client.post(server.url + path, json={**body, "cache_prompt": False}).json()
                timings: dict[str, Any] = reply["timings"]
                speeds.append(float(timings["predicted_per_second"]))
                drafted += int(timings.get("draft_n", 0))
                accepted += int(timings.get("draft_n_accepted", 0))
            results[name] = {"tps": statistics.median(speeds), "drafted": drafted, "accepted": accepted}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = str(gemma_model_path())
    measured: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
    for setting, flags in settings(model).items():
        servers = [kinetic_server(model, COMMON + flags), llama_server(args.llama_server, model, COMMON + flags)]
        for server in servers:
            if server is None:
                continue
            with server:
                measured[(server.name, setting)] = measure(server, args.rounds)
            print(f"measured {server.name} with {setting}", file=sys.stderr)
    rows = []
    for request in REQUESTS:
        for setting in settings(model):
            cells = [request, setting]
            for name in ("kinetic", "llama-server"):
                got = measured.get((name, setting), {}).get(request)
                base = measured.get((name, "none"), {}).get(request)
                if got is None or base is None:
                    cells += ["-", "-", "-"]
                    continue
                rate = f"{got['accepted']:.0f}/{got['drafted']:.0f}" if got["drafted"] else "-"
                cells += [f"{got['tps']:.1f}", f"{got['tps'] / base['tps']:.2f}", rate]
            ours, theirs = (measured.get((n, setting), {}).get(request) for n in ("kinetic", "llama-server"))
            cells.append(f"{ours['tps'] / theirs['tps']:.2f}" if ours and theirs else "-")
            rows.append(cells)
    print(table(["request", "speculation", "kinetic t/s", "vs none", "accepted", "llama-server t/s", "vs none",
                 "accepted", "kinetic / llama-server"], rows))


if __name__ == "__main__":
    main()
