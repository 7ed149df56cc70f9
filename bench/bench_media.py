"""A chat with one image: kinetic beside llama-server, the same model, projector and flags, in one run.

Both servers load the bundled Gemma 3 270M with the tiny gemma3 test projector (tests/projector_model.py:
random weights, 16 embeddings an image), `-c 4096 -np 1 --no-repack`, each with its default chat template.
Each round sends greedy chats of one token (so the answer's time is the time to its first token; the vendored
llama-server drops the connection of a second streamed chat with an image, so nothing is streamed):

- text only: the question alone, nothing cached (`cache_prompt: false`);
- image, nothing cached: the question with a 256x256 PNG, nothing cached;
- new image: the question with an image the server has never seen (a new PNG each round), the text before
  it cached: its file is decoded, encoded by the projector and its embeddings decoded into the slot;
- same image again: that request once more, whose image the prompt cache holds.

The table shows the medians over `--rounds` of the client's time to the token and of the server's own
`prompt_ms`, the image's own cost (`prompt_ms` of the image with nothing cached minus the text's: decoding,
encoding and evaluating it), and kinetic / llama-server for each. Servers take turns.

    flock /tmp/kinetic-tests-model.lock python bench/bench_media.py [--llama-server PATH] [--rounds 5]

llama-server comes from --llama-server, PATH, or /tmp/lsbuild/bin/llama-server (build it with
../shared/peer/build_llama_server.sh); on a CPU with AMX it needs --no-repack, which kinetic gets too.
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from load import Server, kinetic_server, llama_server, median, table  # noqa: E402

from kinetic.backends.bundled import gemma_model_path  # noqa: E402
from tests.projector_model import png_image, tiny_projector  # noqa: E402

QUESTION = "Describe the picture in one sentence."
KINDS = ("text only", "image, nothing cached", "new image", "same image again")


def body(image: bytes | None) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": QUESTION}]
    if image is not None:
        url = "data:image/png;base64," + base64.b64encode(image).decode()
        content.insert(0, {"type": "image_url", "image_url": {"url": url}})
    return {"model": "local", "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": content}]}


def timed(client: httpx.Client, url: str, request: dict[str, Any]) -> tuple[float, float]:
    """(seconds to the one token as the client saw it, the server's prompt_ms) of one chat."""
    started = time.perf_counter()
    response = client.post(url + "/v1/chat/completions", json=request)
    response.raise_for_status()
    return time.perf_counter() - started, float(response.json()["timings"]["prompt_ms"])


def measure(server: Server, rounds: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
    with httpx.Client(timeout=600) as client:
        timed(client, server.url, body(png_image(256, 256, 999)))  # warm-up: the first encode allocates
        for index in range(rounds):
            image = png_image(256, 256, index)
            uncached = {**body(png_image(256, 256, 1000 + index)), "cache_prompt": False}
            samples["text only"].append(timed(client, server.url, {**body(None), "cache_prompt": False}))
            samples["image, nothing cached"].append(timed(client, server.url, uncached))
            samples["new image"].append(timed(client, server.url, body(image)))
            samples["same image again"].append(timed(client, server.url, body(image)))
    return {kind: {"ttft_ms": 1000 * median([s[0] for s in got]), "prompt_ms": median([s[1] for s in got])}
            for kind, got in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model = str(gemma_model_path())
    flags = ["-mm", str(tiny_projector("gemma3")), "-c", "4096", "-np", "1", "--no-repack"]
    measured: dict[str, dict[str, dict[str, float]]] = {}
    for server in (kinetic_server(model, flags), llama_server(args.llama_server, model, flags)):
        if server is None:
            print("llama-server not found: kinetic alone", file=sys.stderr)
            continue
        with server:
            measured[server.name] = measure(server, args.rounds)
        print(f"measured {server.name}", file=sys.stderr)
    rows: list[list[Any]] = []
    for kind in KINDS:
        ours, theirs = measured.get("kinetic", {}).get(kind), measured.get("llama-server", {}).get(kind)
        cells: list[Any] = [kind]
        for got in (ours, theirs):
            cells += [got["ttft_ms"], got["prompt_ms"]] if got else ["-", "-"]
        cells.append(ours["ttft_ms"] / theirs["ttft_ms"] if ours and theirs else "-")
        rows.append(cells)
    image_cost: list[Any] = ["the image's own cost (prompt_ms: image, nothing cached - text only)"]
    costs = {name: got["image, nothing cached"]["prompt_ms"] - got["text only"]["prompt_ms"]
             for name, got in measured.items()}
    image_cost += ["", costs.get("kinetic", "-"), "", costs.get("llama-server", "-")]
    image_cost.append(costs["kinetic"] / costs["llama-server"] if len(costs) == 2 and costs["llama-server"] > 0
                      else "-")
    rows.append(image_cost)
    print(f"{args.rounds} rounds, medians; the tiny gemma3 projector on the bundled Gemma 3 270M, -np 1")
    print(table(["request", "kinetic ms to the token", "kinetic prompt_ms", "llama-server ms to the token",
                 "llama-server prompt_ms", "kinetic / llama-server"], rows))


if __name__ == "__main__":
    main()
