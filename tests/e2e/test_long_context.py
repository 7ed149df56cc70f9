"""Long conversations (issue 23, part 3): --context-shift with --keep, --cache-reuse, --kv-unified-per-slot.

Each test starts the real server on the bundled model (attention only: its cells can move) or on a tiny
hybrid model (tests/hybrid_model.py: its recurrent state cannot move, so llama-server turns both off there,
and so does kinetic), and talks to /completion with token prompts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.hybrid_model import tiny_model
from tests.server import KineticServer

pytestmark = pytest.mark.e2e

N_CTX = 256
# Token prompts from the middle of Gemma's vocabulary, fixed; BOS first.
HEAD = [2] + [1000 + 37 * i % 5000 for i in range(47)]  # 48 tokens
MIDDLE = [9000 + 13 * i % 4000 for i in range(40)]
TAIL = [20000 + 11 * i % 3000 for i in range(64)]
SHORT_TAIL = [30000 + 7 * i % 2000 for i in range(10)]  # below --cache-reuse 16


def complete(url: str, prompt: list[int], **fields: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0, **fields}
    response = httpx.post(url + "/completion", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def plain(model_lock: None) -> Iterator[KineticServer]:
    with KineticServer("-c", str(N_CTX), "-np", "1") as server:
        yield server


@pytest.fixture(scope="module")
def shifting(model_lock: None) -> Iterator[KineticServer]:
    with KineticServer("-c", str(N_CTX), "-np", "1", "--context-shift", "--keep", "8") as server:
        yield server


@pytest.fixture(scope="module")
def reusing(model_lock: None) -> Iterator[KineticServer]:
    with KineticServer("-c", "1024", "-np", "1", "--cache-reuse", "16") as server:
        yield server


def test_without_context_shift_a_full_slot_stops_with_length(plain: KineticServer) -> None:
    result = complete(plain.url, HEAD, n_predict=400, ignore_eos=True)
    assert result["truncated"] is True and result["stop_type"] == "limit"
    assert result["tokens_predicted"] < N_CTX - len(HEAD) + 1


def test_context_shift_keeps_generating_past_the_context(shifting: KineticServer) -> None:
    result = complete(shifting.url, HEAD, n_predict=400, ignore_eos=True)
    assert result["tokens_predicted"] == 400 and result["stop_type"] == "limit"
    assert result["truncated"] is True  # llama-server's mark of a shifted context
    assert result["generation_settings"]["n_keep"] == 8  # --keep is every request's default
    # what the slot holds after the shifts still fits it
    assert result["tokens_cached"] < N_CTX


def test_context_shift_takes_the_requests_n_keep_and_n_discard(shifting: KineticServer) -> None:
    result = complete(shifting.url, HEAD, n_predict=300, ignore_eos=True, n_keep=-1, n_discard=16)
    assert result["tokens_predicted"] == 300 and result["truncated"] is True
    assert (result["generation_settings"]["n_keep"], result["generation_settings"]["n_discard"]) == (-1, 16)


def test_a_prompt_longer_than_the_context_is_still_refused(shifting: KineticServer) -> None:
    """llama-server no longer truncates prompts, context shift or not: a 400 naming the context size."""
    response = httpx.post(shifting.url + "/completion", json={"prompt": HEAD * 6, "n_predict": 4}, timeout=60)
    assert response.status_code == 400
    assert "context" in response.json()["error"]["message"]


def test_a_short_answer_is_not_shifted(shifting: KineticServer) -> None:
    assert complete(shifting.url, HEAD, n_predict=8)["truncated"] is False


def test_cache_reuse_moves_the_chunk_after_a_removed_middle(reusing: KineticServer, plain: KineticServer) -> None:
    """A conversation whose middle was dropped: the cached tail moves down instead of being evaluated again."""
    complete(reusing.url, HEAD + MIDDLE + TAIL)
    shortened = HEAD + TAIL
    reused = complete(reusing.url, shortened)
    # all but the last prompt token, which is evaluated again for its logits
    assert reused["timings"]["cache_n"] == len(shortened) - 1
    assert reused["timings"]["prompt_n"] == 1
    fresh = complete(reusing.url, shortened, cache_prompt=False)
    assert fresh["timings"]["cache_n"] == 0
    assert reused["content"] == fresh["content"]


def test_without_cache_reuse_only_the_common_prefix_is_cached(plain: KineticServer) -> None:
    complete(plain.url, HEAD + MIDDLE + TAIL[:32])
    assert complete(plain.url, HEAD + TAIL[:32])["timings"]["cache_n"] == len(HEAD)


def test_cache_reuse_skips_chunks_shorter_than_its_minimum(reusing: KineticServer) -> None:
    complete(reusing.url, HEAD + MIDDLE + SHORT_TAIL)
    assert complete(reusing.url, HEAD + SHORT_TAIL)["timings"]["cache_n"] == len(HEAD)


def test_kv_unified_per_slot_caps_each_slot(model_lock: None) -> None:
    with KineticServer("-np", "2", "--kv-unified-per-slot", "128") as server:
        props = httpx.get(server.url + "/props", timeout=30).json()
        assert props["default_generation_settings"]["n_ctx"] == 128
        result = complete(server.url, HEAD, n_predict=200, ignore_eos=True)
        assert result["truncated"] is True and result["tokens_predicted"] < 128


def hybrid_server(architecture: str) -> KineticServer:
    return KineticServer("-m", str(tiny_model(architecture)), "-c", str(N_CTX), "-np", "1", "--context-shift",
                         "--cache-reuse", "16")


def check_no_cache_reuse(server: KineticServer) -> None:
    """The tail after a removed middle is evaluated again (or comes from a checkpoint), never moved: the
    recurrent state still holds the middle. The answer is a fresh evaluation's."""
    complete(server.url, HEAD + MIDDLE + TAIL[:32])
    shortened = HEAD + TAIL[:32]
    reused = complete(server.url, shortened)
    assert reused["timings"]["cache_n"] <= len(HEAD)
    assert reused["content"] == complete(server.url, shortened, cache_prompt=False)["content"]
    assert "cache_reuse is not supported by this context" in server.log()


def test_qwen35_refuses_context_shift_and_cache_reuse(model_lock: None) -> None:
    """Qwen3.5's M-RoPE positions cannot be shifted (llama_memory_can_shift): llama-server turns both off,
    with a warning, and a full slot stops with `length`."""
    with hybrid_server("qwen35") as server:
        result = complete(server.url, HEAD, n_predict=400, ignore_eos=True)
        assert result["truncated"] is True and result["tokens_predicted"] < N_CTX - len(HEAD) + 1
        check_no_cache_reuse(server)
        assert "ctx_shift is not supported by this context" in server.log()


@pytest.mark.parametrize("architecture", ["lfm2", "mamba"])
def test_lfm2_and_mamba_shift_the_context_but_reuse_no_chunks(architecture: str, model_lock: None) -> None:
    """Their memory can shift (llama.cpp moves the attention cells and keeps the recurrent state), so
    llama-server shifts their context too; moving chunks of a prompt cannot work on a recurrent state."""
    with hybrid_server(architecture) as server:
        result = complete(server.url, HEAD, n_predict=400, ignore_eos=True)
        assert result["tokens_predicted"] == 400 and result["truncated"] is True
        check_no_cache_reuse(server)
        assert "ctx_shift is not supported" not in server.log()
