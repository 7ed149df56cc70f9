"""`kinetic serve` as a user starts it: errors, warnings, -hf from an offline cache, templates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from kinetic.models import bundled_model_path
from tests.server import KineticServer, free_port


def run_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kinetic", "serve", "--port", str(free_port()), *args],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def test_missing_model_is_one_line_exit_1(tmp_path: Path) -> None:
    result = run_serve("-m", str(tmp_path / "ggml-model.gguf"))
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: model file not found: {tmp_path / 'ggml-model.gguf'}"
    assert "Traceback" not in result.stderr + result.stdout


def test_broken_model_is_one_line_exit_1(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)  # right magic, truncated body: llama.cpp refuses it
    result = run_serve(str(broken))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and str(broken) in error_lines[0]


def test_help_lists_every_flag() -> None:
    result = subprocess.run([sys.executable, "-m", "kinetic", "serve", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for spelling in ("-hf", "--ctx-size", "--parallel", "--api-key-file", "--chat-template-file", "--no-jinja",
                     "--reasoning-format", "--cors-origins", "--offline", "LLAMA_ARG_CTX_SIZE", "KINETIC_PORT"):
        assert spelling in result.stdout


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face hub cache laid out by hand, holding the bundled GGUF under a repo name."""
    home = tmp_path_factory.mktemp("hf-home")
    repo = home / "hub" / "models--test-org--tiny-gemma-GGUF"
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    (snapshot / "tiny-gemma-Q8_0.gguf").write_bytes(b"GGUF-not-this-one")
    (snapshot / "tiny-gemma-Q4_K_M.gguf").symlink_to(bundled_model_path())
    return home


def test_hf_repo_resolves_offline_from_cache(model_lock: None, hub_cache: Path) -> None:
    env = {"HF_HOME": str(hub_cache), "HF_HUB_OFFLINE": "1"}
    with KineticServer("-hf", "test-org/tiny-gemma-GGUF", "-c", "1024", "-np", "1", env=env) as server:
        models = httpx.get(server.url + "/v1/models").json()
        assert models["data"][0]["id"] == "test-org/tiny-gemma-GGUF"
        props = httpx.get(server.url + "/props").json()
        assert props["model_path"].endswith("tiny-gemma-Q4_K_M.gguf")
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert r.model == "test-org/tiny-gemma-GGUF" and r.usage.completion_tokens <= 3


def test_hf_repo_missing_offline_is_clear_error(hub_cache: Path) -> None:
    result = run_serve("-hf", "nobody/nothing-GGUF", "--offline", env={"HF_HOME": str(hub_cache)})
    assert result.returncode == 1 and "nobody/nothing-GGUF" in result.stderr and "Traceback" not in result.stderr


def test_unimplemented_flags_warn_and_serve(model_lock: None) -> None:
    with KineticServer("-c", "1024", "-np", "1", "-ngl", "99", "--mlock", "-fa", "on") as server:
        assert httpx.get(server.url + "/health").status_code == 200
        log = server.log()
    assert "warning: -ngl is a llama-server flag kinetic does not implement; ignored" in log
    assert "warning: --mlock" in log
    assert "listening on http://127.0.0.1:" in log


THINKING_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n"
                     "{% endfor %}<start_of_turn>model\n{% if enable_thinking is not false %}<think>\n{% endif %}")


def test_reasoning_content_split_and_template_kwargs(model_lock: None, tmp_path: Path) -> None:
    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    with KineticServer("-c", "1024", "-np", "1", "--chat-template-file", str(template)) as server:
        props = httpx.get(server.url + "/props").json()
        assert props["chat_template"] == THINKING_TEMPLATE
        assert props["chat_template_origin"] == "--chat-template-file"
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "Think first."}]
        thinking = client.chat.completions.create(model="x", messages=messages, max_tokens=8, temperature=0,
                                                  extra_body={"ignore_eos": True})
        assert thinking.model_extra["timings"]["predicted_n"] == 8
        reasoning = thinking.choices[0].message.model_extra.get("reasoning_content")
        assert reasoning  # the prompt opened <think>, the base model never closes it
        assert reasoning.strip() not in (thinking.choices[0].message.content or "")
        stream = client.chat.completions.create(model="x", messages=messages, max_tokens=8, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True})
        streamed = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or ""
                           for c in stream if c.choices)
        assert streamed == reasoning
        raw = client.chat.completions.create(model="x", messages=messages, max_tokens=8, temperature=0,
                                             extra_body={"ignore_eos": True, "reasoning_format": "none"})
        assert raw.choices[0].message.content.strip() == reasoning.strip()
        off = httpx.post(server.url + "/apply-template", json={"messages": messages,
                                                                "chat_template_kwargs": {"enable_thinking": False}})
        assert not off.json()["prompt"].endswith("<think>\n")
        bad = httpx.post(server.url + "/v1/chat/completions",
                         json={"messages": messages, "chat_template_kwargs": {"enable_thinking": "no"}})
        assert bad.status_code == 400 and "enable_thinking" in bad.json()["error"]["message"]
