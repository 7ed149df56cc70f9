"""Native features behind llama-server flags, on a server of their own: --props (POST /props),
--slot-save-path (a slot's KV cache saved, erased and restored), --pooling none (a vector per
token on /embedding, refused on the OpenAI route), -b/-ub (a prompt longer than the batch is
evaluated in several decodes)."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server import KineticServer

BATCH = 32


@pytest.fixture(scope="module")
def flagged(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    save_dir = tmp_path_factory.mktemp("slots")
    with KineticServer("-c", "2048", "-np", "1", "--embeddings", "--pooling", "none", "--props", "--metrics",
                       "--slot-save-path", str(save_dir), "-b", str(BATCH), "-ub", str(BATCH)) as server:
        yield server.url, save_dir


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120)


def test_post_props_with_props_flag(flagged: tuple[str, Path]) -> None:
    url, _ = flagged
    assert post(url, "/props", {"n_ctx": 1}).json() == {"success": True}
    assert httpx.get(url + "/props").json()["endpoint_props"] is True


def test_slot_save_erase_restore(flagged: tuple[str, Path]) -> None:
    url, save_dir = flagged
    prompt = {"prompt": "A story worth keeping in the cache for later", "n_predict": 4, "temperature": 0}
    first = post(url, "/completion", prompt).json()
    saved = post(url, "/slots/0?action=save", {"filename": "story.bin"}).json()
    assert saved["id_slot"] == 0 and saved["filename"] == "story.bin"
    assert saved["n_saved"] == first["tokens_cached"] and saved["n_written"] == (save_dir / "story.bin").stat().st_size
    assert post(url, "/slots/0?action=erase", {}).json() == {"id_slot": 0, "n_erased": first["tokens_cached"]}
    erased = post(url, "/completion", prompt).json()
    assert erased["timings"]["cache_n"] == 0  # nothing left to reuse
    post(url, "/slots/0?action=erase", {})
    restored = post(url, "/slots/0?action=restore", {"filename": "story.bin"}).json()
    assert restored["n_restored"] == saved["n_saved"] and restored["n_read"] == saved["n_written"]
    again = post(url, "/completion", prompt).json()
    assert again["timings"]["cache_n"] == first["tokens_evaluated"] - 1  # the restored cache is reused
    assert again["content"] == first["content"]


STATE_HEADER = struct.Struct("<III")  # llama.cpp's sequence state file: magic, version, count of token values


def test_slot_file_is_llama_servers_and_an_older_plain_list_restores(flagged: tuple[str, Path]) -> None:
    url, save_dir = flagged
    post(url, "/completion", {"prompt": "What is the capital of France?", "n_predict": 2, "temperature": 0})
    saved = post(url, "/slots/0?action=save", {"filename": "packed.bin"}).json()
    data = (save_dir / "packed.bin").read_bytes()
    _, _, n_values = STATE_HEADER.unpack_from(data)
    values = list(struct.unpack_from(f"<{n_values}i", data, STATE_HEADER.size))
    n = saved["n_saved"]
    assert values[:3] == [-1, 1, n] and values[-1] == 0 and n_values == n + 4  # llama-server's packed prompt
    # As llama.cpp's test_slot_restore_legacy_token_list: rewrite the section as a plain token list.
    tokens = values[3:3 + n]
    plain = (STATE_HEADER.pack(*STATE_HEADER.unpack_from(data)[:2], n) + struct.pack(f"<{n}i", *tokens)
             + data[STATE_HEADER.size + 4 * n_values:])
    (save_dir / "plain.bin").write_bytes(plain)
    for name in ("packed.bin", "plain.bin"):
        post(url, "/slots/0?action=erase", {})
        restored = post(url, "/slots/0?action=restore", {"filename": name}).json()
        assert restored["n_restored"] == n
        again = post(url, "/completion", {"prompt": "What is the capital of Germany?", "n_predict": 1,
                                          "temperature": 0}).json()
        assert again["timings"]["cache_n"] > 0 and again["timings"]["prompt_n"] < again["tokens_evaluated"]


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/slots/abc?action=save", {"filename": "x.bin"}, "Invalid slot ID"),
    ("/slots/0?action=explode", {"filename": "x.bin"}, "Invalid action"),
    ("/slots/0?action=save", {"filename": "../x.bin"}, "Invalid filename"),
    ("/slots/0?action=restore", {"filename": "never-saved.bin"},
     "Unable to restore slot: No available space in KV cache or invalid slot save file"),
])
def test_slot_action_errors(flagged: tuple[str, Path], path: str, body: dict, message: str) -> None:
    response = post(flagged[0], path, body)
    assert response.status_code == 400 and response.json()["error"]["message"] == message


def test_pooling_none_gives_a_vector_per_token(flagged: tuple[str, Path]) -> None:
    url, _ = flagged
    tokens = post(url, "/tokenize", {"content": "three little words", "add_special": True}).json()["tokens"]
    [entry] = post(url, "/embedding", {"content": "three little words"}).json()
    assert len(entry["embedding"]) == len(tokens) and all(len(v) == 640 for v in entry["embedding"])
    norms = [math.sqrt(sum(x * x for x in v)) for v in entry["embedding"]]
    assert not all(math.isclose(n, 1.0, rel_tol=1e-3) for n in norms)  # raw, as llama-server sends them
    refused = post(url, "/v1/embeddings", {"input": "three little words"})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == ("Pooling type 'none' is not OAI compatible. "
                                                  "Please use a different pooling type")


def test_batch_size_splits_a_long_prompt(flagged: tuple[str, Path]) -> None:
    url, _ = flagged

    def decodes() -> float:
        text = httpx.get(url + "/metrics").text
        return next(float(line.split()[1]) for line in text.splitlines()
                    if line.startswith("llamacpp:n_decode_total"))

    before = decodes()
    body = post(url, "/completion", {"prompt": "word " * 150, "n_predict": 1, "cache_prompt": False}).json()
    n_prompt = body["timings"]["prompt_n"]
    assert n_prompt > 3 * BATCH
    # one decode per -b tokens of prompt (the one generated token comes out of the last of them)
    assert decodes() - before >= math.ceil(n_prompt / BATCH)
