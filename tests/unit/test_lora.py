"""--lora, --lora-scaled, --lora-init-without-apply and POST /lora-adapters, without a model (the adapter
acting on the bundled model: tests/e2e/test_server_flags.py)."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from kinetic.errors import InvalidRequestError
from kinetic.protocols.llamacpp.server_state import lora_scales
from kinetic.serve_args import parse_serve_args
from kinetic.settings import SettingsError
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


def test_a_requests_own_lora_is_accepted_and_not_applied() -> None:
    """llama.cpp applies adapters to a whole context; kinetic's slots share one, so a per-request `lora`
    would change every other request's output mid-answer: it is taken, and the server's scales apply."""
    from kinetic.protocols.llamacpp.translate import to_prompt_requests
    from kinetic.protocols.llamacpp.types import CompletionRequest

    body = CompletionRequest.model_validate({"prompt": "hi", "lora": [{"id": 0, "scale": 1.0}]})
    (request,) = to_prompt_requests(body)
    assert request.prompt == "hi" and not hasattr(request.options, "lora")
