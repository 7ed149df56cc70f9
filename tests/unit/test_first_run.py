"""A first run (issue 48): which bundled model a server with no model serves, how -m names one, and the lines
the start prints after llama-server's `listening on`."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from kinetic.backends.bundled import BASE_MODEL, BUNDLED, CHAT_MODEL, by_name, default_model
from kinetic.backends.gguf_files import model_file
from kinetic.errors import ModelLoadError
from kinetic.server.welcome import Served, browsable, welcome_lines


def test_bundled_models_answer_to_their_short_names_and_ids() -> None:
    assert by_name("smollm2") is CHAT_MODEL and by_name(CHAT_MODEL.name) is CHAT_MODEL
    assert by_name("gemma") is BASE_MODEL and by_name("gemma-3-270m-q4_k_m") is BASE_MODEL
    assert by_name("llama") is None
    assert len({model.name for model in BUNDLED}) == len(BUNDLED)


def test_the_default_is_the_chat_model_and_bundled_chooses() -> None:
    assert CHAT_MODEL.installed, "requirements/default-model.txt installs it (the README's commands)"
    assert default_model(None) == (CHAT_MODEL, None)
    assert default_model("gemma") == (BASE_MODEL, None)
    with pytest.raises(ModelLoadError, match="--bundled 'qwen': no such bundled model .*smollm2, gemma"):
        default_model("qwen")


def test_m_takes_a_bundled_name_only_where_no_such_file_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, name = model_file("gemma")
    assert path.name == "gemma-3-270m-q4_k_m.gguf" and name == "gemma-3-270m-q4_k_m"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gemma").write_bytes(b"GGUF")  # a file of that name wins, as a path always does
    assert model_file("gemma") == (Path("gemma"), "gemma")
    assert model_file("missing.gguf") == (Path("missing.gguf"), "missing.gguf")


def test_the_welcome_lines_say_where_to_go() -> None:
    served = Served(name="smollm2-135m-instruct-q4_1", n_ctx=8192, n_slots=4)
    lines = welcome_lines("http://0.0.0.0:8080", served, chat_page=True, keyed=False)
    assert lines[0] == "chat page: http://127.0.0.1:8080/"  # every interface: this machine's browser uses loopback
    assert lines[1] == "model: smollm2-135m-instruct-q4_1, context 8192 tokens in each of 4 slot(s)"
    command = shlex.split(lines[2].removeprefix("try: "))
    assert command[:2] == ["curl", "http://127.0.0.1:8080/v1/chat/completions"] and "Authorization" not in lines[2]
    assert command[-2:] == ["-d", '{"messages": [{"role": "user", "content": "hello"}], "max_tokens": 100}']


def test_a_keyed_server_names_its_dashboard_and_the_key_the_curl_needs() -> None:
    lines = welcome_lines("http://[::]:9000", Served(name="m", n_ctx=2048, n_slots=1), chat_page=True, keyed=True,
                          api_prefix="/api/v2")
    assert lines[0] == "chat page: http://[::1]:9000/  (it asks for your key)"
    assert lines[1] == "dashboard: http://[::1]:9000/dashboard  (an admin key)"
    assert '-H "Authorization: Bearer $KEY"' in lines[3] and "http://[::1]:9000/api/v2/v1/chat/completions" in lines[3]


def test_a_router_and_a_server_without_the_chat_page() -> None:
    router = welcome_lines("http://127.0.0.1:8080", Served(name="local-model", router_models=3), chat_page=False,
                           keyed=False)
    assert not any(line.startswith("chat page") for line in router)
    assert router[0] == "models: 3, loaded on first use; a request that names none gets local-model"
    listed = welcome_lines("http://127.0.0.1:8080", Served(name="", router_models=2), chat_page=True, keyed=False)
    assert listed[1] == "models: 2, loaded on first use; a request names one in its `model` field"
    assert browsable("https://10.0.0.5:443") == "https://10.0.0.5:443"
