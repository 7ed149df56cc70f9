"""--lora, --lora-scaled, --lora-init-without-apply and POST /lora-adapters, without a model (the adapter
acting on the bundled model: tests/e2e/test_server_flags.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import gguf
import pytest

from kinetic.config.args import parse_serve_args
from kinetic.config.settings import SettingsError
from kinetic.engine.llama.adapter_turns import AdapterTurns
from kinetic.engine.llama.inbox import LoopInbox
from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.llama.sampler import Sampler
from kinetic.engine.llama.slots import Job, Slot
from kinetic.engine.types import Event, GenerationRequest
from kinetic.errors import InvalidRequestError
from kinetic.protocols.common.translate import lora_request
from kinetic.protocols.llamacpp.server_state import lora_scales
from kinetic.protocols.llamacpp.translate import to_prompt_requests
from kinetic.protocols.llamacpp.types import CompletionRequest
from kinetic.protocols.openai.translate import to_chat_request
from kinetic.protocols.openai.types import ChatCompletionRequest
from tests.lora_model import write_lora


def test_lora_flags_become_adapters_with_scales(tmp_path: Path) -> None:
    a, b, c = (tmp_path / name for name in ("a.gguf", "b.gguf", "c.gguf"))
    for path in (a, b, c):
        path.write_bytes(b"GGUF")
    s = parse_serve_args(["--lora", f"{a},{b}", "--lora-scaled", f"{c}:0.25"], environ={})
    assert s.llama_options().lora == ((str(a), 1.0), (str(b), 1.0), (str(c), 0.25))
    assert parse_serve_args(["--lora", str(a), "--lora-init-without-apply"], environ={}) \
        .llama_options().lora_init_without_apply
    assert parse_serve_args(["--lora", str(a)], environ={}).llama_options().describe()["lora"] == \
        [{"path": str(a), "scale": 1.0}]


@pytest.mark.parametrize(("argv", "message"), [
    (["--lora", "/no/such.gguf"], "for --lora: '/no/such.gguf': no such file"),
    (["--lora-scaled", "adapter.gguf"], "for --lora-scaled: 'adapter.gguf': expected FNAME:SCALE"),
])
def test_bad_lora_flags_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_serve_args(argv, environ={})


def test_post_lora_adapters_body() -> None:
    assert lora_scales([{"id": 0, "scale": 0.5}, {"id": 3}]) == {0: 0.5, 3: 0.0}
    for bad in ({"id": 0}, [1], [{"id": "0", "scale": 1}], [{"id": 0, "scale": True}]):
        with pytest.raises(InvalidRequestError):
            lora_scales(bad)


def test_the_test_adapter_is_a_lora_gguf_for_gemma3(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(str(write_lora(tmp_path / "lora.gguf")))
    fields = {name: reader.fields[name] for name in ("general.type", "general.architecture", "adapter.type")}
    assert {k: bytes(f.parts[f.data[0]]).decode() for k, f in fields.items()} == \
        {"general.type": "adapter", "general.architecture": "gemma3", "adapter.type": "lora"}
    tensors = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    assert tensors["blk.0.ffn_down.weight.lora_a"] == [2048, 4] and tensors["blk.0.ffn_down.weight.lora_b"] == [4, 640]


def test_a_requests_own_lora_reaches_the_engine_request() -> None:
    """llama-server's per-request `lora` (parse_lora_request): its (id, scale) pairs; none, or an empty list, is
    the server's scales; a bad shape is a 400 naming the field."""
    body = CompletionRequest.model_validate({"prompt": "hi", "lora": [{"id": 0, "scale": 0.5}, {"id": 2}]})
    (request,) = to_prompt_requests(body)
    assert request.options.lora == ((0, 0.5), (2, 0.0))
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}],
                                                 "lora": [{"id": 0, "scale": 1}]})
    assert to_chat_request(chat).options.lora == ((0, 1.0),)
    assert lora_request(None) is None and lora_request([]) is None
    for bad in ({"id": 0}, [1], [{"id": 0, "scale": "1"}]):
        with pytest.raises(InvalidRequestError) as caught:
            lora_request(bad)
        assert caught.value.param == "lora"


class Adapters:
    """LoadedModel's adapter part, as AdapterTurns uses it: records what it sets on the context."""

    def __init__(self) -> None:
        self.set: list[tuple[float, ...]] = []

    def lora_scales(self) -> tuple[float, ...]:
        return (1.0,)

    def apply_lora(self, ctx: object, scales: tuple[float, ...]) -> None:
        self.set.append(scales)


def busy_slot(index: int, scales: tuple[float, ...]) -> Slot:
    job = Job(request=GenerationRequest(prompt_tokens=[1]), sampler=cast(Sampler, None),
              inbox=cast(LoopInbox, None), queue=cast("asyncio.Queue[Event | BaseException]", None), lora=scales)
    return Slot(id=index, job=job, next_token=5)


def test_slots_of_different_adapter_scales_take_turns_and_the_context_changes_only_between_them() -> None:
    model = Adapters()
    turns = AdapterTurns(cast(LoadedModel, model), cast(Any, None))
    same = [busy_slot(0, (1.0,)), busy_slot(1, (1.0,))]
    assert [turns.next_turn(same) for _ in range(3)] == [(1.0,)] * 3  # one set: every step batches both
    mixed = [busy_slot(0, (1.0,)), busy_slot(1, (0.0,))]
    picked = [turns.next_turn(mixed) for _ in range(4)]
    assert picked == [(1.0,), (0.0,), (1.0,), (0.0,)]  # in turn: neither set waits for the other to finish
    for scales in picked:
        turns.use(scales)
        turns.use(scales)  # already set: no second call
    assert model.set == [(0.0,), (1.0,), (0.0,)]  # the server's (1.0,) was set when the context was made
