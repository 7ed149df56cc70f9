"""The per-request `lora` field on a hybrid model (issue 35, part 4): a prompt's cached state is reused only
under the adapter scales it was evaluated with. On LFM2 (tests/hybrid_model.py) the reuse is a whole saved
state (the slot's own, or a checkpoint in the --cache-ram store), so a state evaluated with the adapter
would carry it into a base request, and the other way round, if the keys left the scales out.

Each answer is compared with a fresh evaluation under the same scales (`cache_prompt: false`), greedy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.hybrid_model import N_EMBD, tiny_model
from tests.lora_model import write_lora
from tests.server import KineticServer

pytestmark = pytest.mark.e2e

# the tiny LFM2's shape (hybrid_model._write_lfm2)
LFM2_LAYERS, LFM2_FFN = 4, 128
PROMPT = "The students of the lab open the notebook, read the first cell and run it. " * 4
BASE, ADAPTER = [{"id": 0, "scale": 0.0}], [{"id": 0, "scale": 1.0}]


@pytest.fixture(scope="module")
def server(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KineticServer]:
    adapter = write_lora(tmp_path_factory.mktemp("lora") / "lfm2-lora.gguf", arch="lfm2", n_layers=LFM2_LAYERS,
                         ffn=LFM2_FFN, embd=N_EMBD, strength=1.0)
    with KineticServer("-m", str(tiny_model("lfm2")), "--lora", str(adapter), "-c", "1024", "-np", "1") as running:
        yield running


def complete(server: KineticServer, lora: list[dict[str, Any]], *, cache: bool = True) -> dict[str, Any]:
    body = {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "lora": lora, "cache_prompt": cache}
    reply = httpx.post(server.url + "/completion", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_cached_state_is_reused_only_under_the_scales_it_was_evaluated_with(server: KineticServer) -> None:
    fresh = {"base": complete(server, BASE, cache=False)["content"],
             "adapter": complete(server, ADAPTER, cache=False)["content"]}
    assert fresh["base"] != fresh["adapter"]  # the adapter changes the greedy text, so a mix-up would show
    first = complete(server, BASE)  # evaluated with the base: its checkpoints are the base's
    assert first["content"] == fresh["base"]
    switched = complete(server, ADAPTER)  # the same prompt under the adapter: nothing of the base's is reused
    assert switched["content"] == fresh["adapter"]
    assert switched["timings"]["cache_n"] == 0
    again = complete(server, ADAPTER)  # the adapter's own state: reused
    assert again["content"] == fresh["adapter"] and again["timings"]["cache_n"] > 0
    back = complete(server, BASE)  # back to the base: never the adapter's state (measured: nothing reused)
    assert back["content"] == fresh["base"]
