"""`kinetic serve` as a user starts it: errors, warnings, -hf from an offline cache, templates."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from kinetic.backends.bundled import gemma_model_path
from kinetic.cli import main
from tests.fake_hub import FakeHub
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


def serve_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`python -m kinetic serve ARGS` for a command line that ends before anything starts (help, a bad
    setting): `kinetic.cli.main`, the function `python -m kinetic` runs, called here without a new
    process; its exit code, stdout and stderr."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    capsys.readouterr()
    try:
        code = main(["serve", *args])
    finally:  # main() configures logging once per process: this process is pytest's
        root.handlers[:], root.level = handlers, level
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = serve_in_process(capsys, "--help")
    assert code == 0
    for spelling in ("-hf", "--ctx-size", "--parallel", "--api-key-file", "--chat-template-file", "--no-jinja",
                     "--reasoning-format", "--cors-origins", "--offline", "LLAMA_ARG_CTX_SIZE", "KINETIC_PORT"):
        assert spelling in out


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--port", "abc"], {}, "error: invalid value 'abc' for --port: expected an integer"),
    ([], {"KINETIC_PORT": "abc"}, "error: invalid value 'abc' for KINETIC_PORT: expected an integer"),
    (["--chat-template-kwargs", "{enable_thinking: false}"], {},
     "error: invalid value '{enable_thinking: false}' for --chat-template-kwargs: not valid JSON"),
    ([], {"LLAMA_ARG_THINK": "r1"}, "error: invalid value 'r1' for LLAMA_ARG_THINK: expected one of: none, auto"),
    (["--no-such-flag"], {}, "error: unknown flag --no-such-flag"),
])
def test_bad_setting_is_one_line_exit_2(args: list[str], env: dict[str, str], message: str,
                                       capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = serve_in_process(capsys, *args)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(message)


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
    (snapshot / "tiny-gemma-Q4_K_M.gguf").symlink_to(gemma_model_path())
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
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: nobody/nothing-GGUF is not in the Hugging Face cache")
    assert len(result.stderr.splitlines()) == 1


def closed_hub() -> str:
    """A Hugging Face endpoint nothing listens on: what a machine without network gets."""
    return f"http://127.0.0.1:{free_port()}"


def test_hf_unreachable_and_not_cached_is_one_clear_error(tmp_path: Path) -> None:
    hub = closed_hub()
    result = run_serve("-hf", "ggml-org/Qwen3.5-0.8B-GGUF", "-a", "qwen-0.8b",
                       env={"HF_HOME": str(tmp_path), "HF_ENDPOINT": hub})
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr  # no retry chatter, no traceback
    line = lines[0]
    assert line.startswith("error: cannot get ggml-org/Qwen3.5-0.8B-GGUF: ")
    assert f"Hugging Face ({hub}) cannot be reached" in line  # what was tried: the hub...
    assert f"not in the Hugging Face cache ({tmp_path / 'hub'})" in line  # ...and the cache
    assert "--offline" in line and "-m PATH" in line  # what to do


def test_hf_unreachable_uses_the_cached_copy(model_lock: None, hub_cache: Path) -> None:
    hub = closed_hub()
    env = {"HF_HOME": str(hub_cache), "HF_ENDPOINT": hub}
    with KineticServer("-hf", "test-org/tiny-gemma-GGUF", "-c", "1024", "-np", "1", env=env) as server:
        assert httpx.get(server.url + "/v1/models").json()["data"][0]["id"] == "test-org/tiny-gemma-GGUF"
        log = server.log()
    notes = [line for line in log.splitlines() if "Hugging Face" in line]
    assert len(notes) == 1 and notes[0].startswith(f"warning: Hugging Face ({hub}) cannot be reached")
    assert "using the cached copy" in notes[0] and notes[0].endswith("tiny-gemma-Q4_K_M.gguf")
    assert "Retry" not in log and "Traceback" not in log


def test_hf_downloads_with_a_progress_bar_then_serves(model_lock: None, tmp_path: Path) -> None:
    repo = {"tiny-gemma-Q8_0.gguf": gemma_model_path(), "tiny-gemma-Q4_K_M.gguf": gemma_model_path()}
    with FakeHub({"test-org/tiny-gemma-GGUF": repo}) as hub:
        # TQDM_POSITION=-1 is huggingface_hub's switch to draw the bar when stderr is not a terminal.
        env = {"HF_HOME": str(tmp_path), "HF_ENDPOINT": hub.url, "TQDM_POSITION": "-1"}
        with KineticServer("-hf", "test-org/tiny-gemma-GGUF", "-c", "1024", "-np", "1", env=env) as server:
            assert httpx.get(server.url + "/v1/models").json()["data"][0]["id"] == "test-org/tiny-gemma-GGUF"
            log = server.log()
        assert [r for r in hub.requests if "/resolve/" in r and r.startswith("GET")] == [
            "GET /test-org/tiny-gemma-GGUF/resolve/main/tiny-gemma-Q4_K_M.gguf"]
    cached = list((tmp_path / "hub" / "models--test-org--tiny-gemma-GGUF" / "snapshots").glob("*/*.gguf"))
    assert [p.name for p in cached] == ["tiny-gemma-Q4_K_M.gguf"]
    assert "tiny-gemma-Q4_K_M.gguf: 100%|" in log  # the bar, finished
    assert "HTTP Request:" not in log and "Traceback" not in log


def test_hf_repo_or_file_not_on_the_hub_is_one_clear_error(tmp_path: Path) -> None:
    with FakeHub({"test-org/tiny-gemma-GGUF": {"tiny-gemma-Q8_0.gguf": gemma_model_path()}}) as hub:
        env = {"HF_HOME": str(tmp_path), "HF_ENDPOINT": hub.url}
        no_repo = run_serve("-hf", "nobody/nothing-GGUF", env=env)
        no_file = run_serve("-hf", "test-org/tiny-gemma-GGUF", "-hff", "tiny-gemma-Q2_K.gguf", env=env)
        no_quant = run_serve("-hf", "test-org/tiny-gemma-GGUF:Q2_K", env=env)
    for result in (no_repo, no_file, no_quant):
        assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    assert no_repo.stderr.startswith(f"error: nobody/nothing-GGUF was not found on Hugging Face ({hub.url})")
    assert no_file.stderr == ("error: test-org/tiny-gemma-GGUF has no file tiny-gemma-Q2_K.gguf (-hff); "
                              "its GGUF files: tiny-gemma-Q8_0.gguf\n")
    assert no_quant.stderr == ("error: test-org/tiny-gemma-GGUF: no file for quant Q2_K among: "
                               "tiny-gemma-Q8_0.gguf\n")


def test_unimplemented_flags_warn_and_serve(model_lock: None) -> None:
    # Switches that must not swallow the next argument, and value flags whose value must not become the
    # model path: a line that starts llama-server starts kinetic. The flags kinetic ignores warn, naming the
    # row of the differences table that says why; the ones that act do not.
    args = ("-c", "1024", "-kvu", "-np", "1", "-ngl", "99", "--mlock", "-fa", "on", "--video-ffmpeg-dir", "p",
            "-r", "User:", "--video-fps", "4", "-ot", "exps=CPU", "--override-kv",
            "tokenizer.ggml.add_bos_token=bool:true", "--dry-multiplier", "0.8", "--xtc-probability", "0.1",
            "--no-warmup")
    with KineticServer(*args, env={"LLAMA_ARG_N_GPU_LAYERS": "99", "LLAMA_ARG_RPC": "host:1"}) as server:
        assert httpx.get(server.url + "/health").status_code == 200
        assert httpx.get(server.url + "/props").json()["total_slots"] == 1
        log = server.log()
    video = "video input and the encoder's batch"
    for flag, row in (("--video-ffmpeg-dir", video), ("--video-fps", video)):
        assert log.count(f'warning: {flag} is ignored: see "ignored flags: {row}" under Differences from '
                         "llama-server (docs/reference/http-llamacpp.md)\n") == 1
    for flag in ("-kvu", "-ngl", "--mlock", "-fa", "-r", "-ot", "--override-kv", "--dry-multiplier",
                 "--xtc-probability", "--no-warmup"):
        assert f"warning: {flag} " not in log  # they act
    assert "warming up the model" not in log  # --no-warmup: the first request pays the backends' first use
    assert log.count('warning: LLAMA_ARG_RPC (--rpc) is ignored: '
                     'see "ignored flags: remote devices and fitting to memory"') == 1
    assert "LLAMA_ARG_N_GPU_LAYERS" not in log
    assert "listening on http://127.0.0.1:" in log


def test_default_slots_serve_a_class_at_once(model_lock: None) -> None:
    """Without -np, 16 slots over one unified cache, where every slot may use the whole context."""
    with KineticServer("-c", "4096", "-v") as server:
        props = httpx.get(server.url + "/props").json()
        assert props["total_slots"] == 16 and props["default_generation_settings"]["n_ctx"] == 4096
        assert re.search(r"llama_context: kv_unified\s+= true\n", server.log())
        assert "warming up the model with an empty run" in server.log()  # --warmup is llama-server's default
        slots = httpx.get(server.url + "/slots").json()
        assert len(slots) == 16 and {s["n_ctx"] for s in slots} == {4096}


BATCHED_PROMPT = "one two three four five six seven eight nine ten " * 12


def batch_ends(url: str) -> tuple[list[int], int]:
    """Where the prompt's batches ended (prompt_progress after each one), and the prompt's length."""
    body = {"prompt": BATCHED_PROMPT, "n_predict": 1, "stream": True, "return_progress": True, "cache_prompt": False}
    with httpx.stream("POST", url + "/completion", json=body, timeout=120) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    return [p["processed"] for p in progress[1:]], events[-1]["tokens_evaluated"]


def test_batch_sizes_reach_llama_cpp(model_lock: None) -> None:
    """-b/-ub set llama.cpp's context (its verbose load log says so), a prompt longer than a batch works, and
    on Gemma's sliding window its batches end where llama-server's do: every 32 tokens, then min(32, 4 + 16)
    and 4 tokens before the end (none of those two with --swa-full, as there)."""
    with KineticServer("-c", "1024", "-np", "1", "-b", "32", "-ub", "16", "-v") as server:
        body = httpx.post(server.url + "/completion", json={"prompt": BATCHED_PROMPT, "n_predict": 4,
                                                             "temperature": 0}, timeout=120).json()
        log = server.log()
        ends, n_prompt = batch_ends(server.url)
    assert re.search(r"llama_context: n_batch\s+= 32\n", log) and re.search(r"llama_context: n_ubatch\s+= 16\n", log)
    assert body["tokens_evaluated"] > 100 and body["timings"]["predicted_n"] >= 1
    whole = [*range(32, n_prompt, 32), n_prompt]
    assert ends == sorted({*[n for n in whole if n < n_prompt - 20], n_prompt - 20, n_prompt - 4, n_prompt})
    with KineticServer("-c", "1024", "-np", "1", "-b", "32", "-ub", "16", "--swa-full") as server:
        assert batch_ends(server.url) == (whole, n_prompt)


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
