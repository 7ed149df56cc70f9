"""Images (and audio) reach the model on every protocol, through the real clients, on the bundled Gemma with its
tiny test projector and on the tiny Qwen3.5 (hybrid memory, M-RoPE) with its qwen3vl_merger projector.

The projectors' weights are random (tests/projector_model.py), so the answers are nonsense; what is checked is
that the image really reaches the model (two images part the first token's logits, one image sent twice gives
the very same ones), that the cache stays exact (a repeated image is reused, a different one never is), that
usage counts the image's tokens, and that a broken file is a 400 naming its part with nothing left behind.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hybrid_model import tiny_model
from tests.projector_model import png_image, tiny_projector, wav_tone
from tests.server import KineticServer

pytestmark = pytest.mark.e2e

GEMMA_IMAGE_TOKENS = 16  # the tiny gemma3 projector pools every image to 16 embeddings
QWEN_IMAGE_TOKENS, QWEN_IMAGE_POSITIONS = 16, 4  # a 64x64 image on qwen3vl_merger: a 4x4 grid, M-RoPE
QUESTION = "What is in the picture?"


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image_message(image: bytes, text: str = QUESTION) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image)}},
                                         {"type": "text", "text": text}]}]


def chat(url: str, messages: list[dict[str, Any]], **fields: Any) -> httpx.Response:
    body = {"messages": messages, "max_tokens": 6, "temperature": 0, **fields}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def first_token_logprobs(url: str, image: bytes, **fields: Any) -> list[tuple[str, float]]:
    response = chat(url, image_message(image), logprobs=True, top_logprobs=5, max_tokens=1, **fields)
    assert response.status_code == 200, response.text
    top = response.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return [(entry["token"], entry["logprob"]) for entry in top]


def idle(url: str) -> bool:
    return not any(slot["is_processing"] for slot in httpx.get(url + "/slots", timeout=10).json())


@pytest.fixture(scope="module")
def media_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """--media-path: the folder file:// URLs may read from, with one picture in it."""
    folder = tmp_path_factory.mktemp("media")
    (folder / "picture.png").write_bytes(png_image(64, 64, 101))
    return folder


@pytest.fixture(scope="module")
def gemma(model_lock: None, media_folder: Path) -> Iterator[KineticServer]:
    with KineticServer("-mm", str(tiny_projector("gemma3")), "-c", "4096", "-np", "2", "-a", "seer",
                       "--media-path", str(media_folder)) as server:
        yield server


@pytest.fixture(scope="module")
def picture_site() -> Iterator[str]:
    """A web server on 127.0.0.1 with /picture.png, and /elsewhere redirecting to it."""
    image = png_image(64, 64, 101)

    class Pictures(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802  the standard library's name
            if self.path == "/elsewhere":
                self.send_response(302)
                self.send_header("Location", "/picture.png")
                self.end_headers()
                return
            found = self.path == "/picture.png"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(image) if found else 0))
            self.end_headers()
            if found:
                self.wfile.write(image)

        def log_message(self, *args: Any) -> None:
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pictures)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{site.server_address[1]}"
    site.shutdown()


@pytest.fixture(scope="module")
def qwen(model_lock: None) -> Iterator[KineticServer]:
    with KineticServer("-m", str(tiny_model("qwen35")), "-mm", str(tiny_projector("qwen3vl")), "-c", "4096",
                       "-np", "1", "-a", "qwen-seer") as server:
        yield server


# ------------------------------------------------------------------ what the model says it reads


def test_the_listing_routes_say_the_model_sees(gemma: KineticServer) -> None:
    props = httpx.get(gemma.url + "/props").json()
    assert props["modalities"] == {"vision": True, "video": False, "audio": False}
    assert props["media_marker"].startswith("<__media_")
    model = httpx.get(gemma.url + "/v1/models").json()["data"][0]
    assert model["capabilities"] == ["completion", "multimodal"]
    show = httpx.post(gemma.url + "/api/show", json={"model": "seer"}).json()
    assert "vision" in show["capabilities"]


# ------------------------------------------------------------------ every protocol, its real client


def test_openai_sdk_chat_with_an_image_counts_its_tokens(gemma: KineticServer) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=gemma.url + "/v1", api_key="none", max_retries=0)
    image = png_image(64, 64, 1)
    with_image = client.chat.completions.create(model="seer", messages=image_message(image), max_tokens=4,  # type: ignore[arg-type]
                                                temperature=0)
    text_only = client.chat.completions.create(model="seer", messages=[{"role": "user", "content": QUESTION}],
                                               max_tokens=4, temperature=0)
    assert with_image.usage is not None and text_only.usage is not None
    # the image's embeddings, and the <start_of_image> / <end_of_image> text mtmd puts around them
    assert with_image.usage.prompt_tokens >= text_only.usage.prompt_tokens + GEMMA_IMAGE_TOKENS
    assert with_image.choices[0].finish_reason == "length"


def test_ollama_client_images_on_chat_and_generate(gemma: KineticServer) -> None:
    import ollama

    client = ollama.Client(host=gemma.url)
    image = png_image(64, 64, 2)
    answer = client.chat(model="seer", messages=[{"role": "user", "content": QUESTION, "images": [image]}],
                         options={"num_predict": 4, "temperature": 0})
    assert answer.done and answer.prompt_eval_count is not None
    plain = client.generate(model="seer", prompt=QUESTION, options={"num_predict": 4, "temperature": 0})
    seen = client.generate(model="seer", prompt=QUESTION, images=[image], options={"num_predict": 4, "temperature": 0})
    assert seen.prompt_eval_count is not None and plain.prompt_eval_count is not None
    assert seen.prompt_eval_count >= plain.prompt_eval_count + GEMMA_IMAGE_TOKENS


def test_anthropic_sdk_image_block(gemma: KineticServer) -> None:
    from anthropic import Anthropic

    client = Anthropic(base_url=gemma.url, api_key="none", max_retries=0)
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png_image(64, 64, 3)).decode()}
    message = client.messages.create(model="seer", max_tokens=4, messages=[{"role": "user", "content": [
        {"type": "image", "source": source}, {"type": "text", "text": QUESTION}]}])  # type: ignore[typeddict-item,misc]
    assert message.usage.input_tokens >= GEMMA_IMAGE_TOKENS


def test_responses_input_image(gemma: KineticServer) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=gemma.url + "/v1", api_key="none", max_retries=0)
    response = client.responses.create(model="seer", max_output_tokens=4, input=[{"role": "user", "content": [
        {"type": "input_text", "text": QUESTION},
        {"type": "input_image", "image_url": data_url(png_image(64, 64, 4)), "detail": "auto"}]}])
    assert response.usage is not None and response.usage.input_tokens >= GEMMA_IMAGE_TOKENS


def test_completion_multimodal_data_at_the_marker(gemma: KineticServer) -> None:
    marker = httpx.get(gemma.url + "/props").json()["media_marker"]
    image = base64.b64encode(png_image(64, 64, 5)).decode()
    prompt = {"prompt_string": f"A picture: {marker} It shows", "multimodal_data": [image]}
    response = httpx.post(gemma.url + "/completion", json={"prompt": prompt, "n_predict": 4, "temperature": 0},
                          timeout=120)
    assert response.status_code == 200, response.text
    assert response.json()["tokens_evaluated"] >= GEMMA_IMAGE_TOKENS
    two_markers = {"prompt_string": f"{marker} and {marker}", "multimodal_data": [image]}
    refused = httpx.post(gemma.url + "/completion", json={"prompt": two_markers, "n_predict": 4}, timeout=60)
    assert refused.status_code == 400 and "marker" in refused.json()["error"]["message"]


def test_n_cmpl_copies_of_a_prompt_with_an_image_read_the_same_image(gemma: KineticServer) -> None:
    """The copies start from the same cells and evaluate the image side by side (the gemma fixture has 2 slots)."""
    marker = httpx.get(gemma.url + "/props").json()["media_marker"]
    prompt = {"prompt_string": f"{marker} The picture shows", "multimodal_data": [
        base64.b64encode(png_image(64, 64, 111)).decode()]}
    copies = httpx.post(gemma.url + "/completion", json={"prompt": prompt, "n_cmpl": 2, "n_predict": 8,
                                                          "temperature": 0, "cache_prompt": False}, timeout=120)
    assert copies.status_code == 200, copies.text
    first, second = copies.json()
    # the same arithmetic on the same cells: the same text (a copy alone may part at a near tie: another batch shape)
    assert first["content"] == second["content"]
    assert first["tokens_evaluated"] == second["tokens_evaluated"] >= GEMMA_IMAGE_TOKENS
    assert idle(gemma.url)


# ------------------------------------------------------------------ the image is really read, the cache exact


def test_two_images_part_the_logits_one_image_twice_does_not(gemma: KineticServer) -> None:
    first = first_token_logprobs(gemma.url, png_image(64, 64, 11), cache_prompt=False)
    again = first_token_logprobs(gemma.url, png_image(64, 64, 11), cache_prompt=False)
    other = first_token_logprobs(gemma.url, png_image(64, 64, 12), cache_prompt=False)
    assert first == again
    assert first != other


def test_a_repeated_image_is_reused_a_different_one_never(gemma: KineticServer) -> None:
    image, other = png_image(64, 64, 21), png_image(64, 64, 22)
    fresh = chat(gemma.url, image_message(image), cache_prompt=False).json()
    cached = chat(gemma.url, image_message(image)).json()
    assert cached["timings"]["cache_n"] >= cached["usage"]["prompt_tokens"] - 1
    assert cached["choices"][0]["message"]["content"] == fresh["choices"][0]["message"]["content"]
    # same text, another image: only what comes before the image may come from the cache
    swapped = chat(gemma.url, image_message(other)).json()
    assert swapped["timings"]["cache_n"] < 10
    alone = chat(gemma.url, image_message(other), cache_prompt=False).json()
    assert swapped["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]


def test_hybrid_model_reads_images_and_restores_a_checkpoint_after_one(qwen: KineticServer) -> None:
    image = png_image(64, 64, 31)
    assert first_token_logprobs(qwen.url, image, cache_prompt=False) != \
        first_token_logprobs(qwen.url, png_image(64, 64, 32), cache_prompt=False)
    fresh = chat(qwen.url, image_message(image), cache_prompt=False).json()
    first = chat(qwen.url, image_message(image)).json()
    again = chat(qwen.url, image_message(image)).json()
    texts = {r["choices"][0]["message"]["content"] for r in (fresh, first, again)}
    assert len(texts) == 1, texts
    assert again["timings"]["cache_n"] > 0  # a state saved past the image, not evaluated again
    # usage counts the image's 16 embeddings, though it takes 4 positions (M-RoPE)
    text_only = chat(qwen.url, [{"role": "user", "content": QUESTION}]).json()
    assert again["usage"]["prompt_tokens"] - text_only["usage"]["prompt_tokens"] >= QWEN_IMAGE_TOKENS
    other = chat(qwen.url, image_message(png_image(64, 64, 33))).json()
    alone = chat(qwen.url, image_message(png_image(64, 64, 33)), cache_prompt=False).json()
    assert other["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]


# ------------------------------------------------------------------ files named by URL


def url_message(url: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": QUESTION}]}]


def test_an_image_by_url_is_the_same_image_as_inline(gemma: KineticServer, picture_site: str) -> None:
    inline = first_token_logprobs(gemma.url, png_image(64, 64, 101), cache_prompt=False)
    for url in (picture_site + "/picture.png", picture_site + "/elsewhere", "file://picture.png"):
        response = chat(gemma.url, url_message(url), logprobs=True, top_logprobs=5, max_tokens=1, cache_prompt=False)
        assert response.status_code == 200, (url, response.text)
        top = response.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        assert [(entry["token"], entry["logprob"]) for entry in top] == inline, url


def test_a_url_that_cannot_be_had_is_a_400_saying_why(gemma: KineticServer, picture_site: str) -> None:
    for url, why in ((picture_site + "/missing.png", "HTTP 404"), ("file://../etc/passwd", "not allowed"),
                     ("file://nothing-here.png", "does not exist"), ("gopher://example.org/x", "scheme")):
        refused = chat(gemma.url, url_message(url))
        assert refused.status_code == 400, (url, refused.text)
        error = refused.json()["error"]
        assert why in error["message"] and error["param"] == "messages[0].content[0].image_url.url", (url, error)
    assert idle(gemma.url)


def test_a_keyed_server_does_not_fetch_from_the_classroom_network(picture_site: str, model_lock: None,
                                                                  tmp_path: Path) -> None:
    """With keys, a student's URL may not reach a private or loopback address unless the admin allows it."""
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-alice alice\n")
    auth = {"Authorization": "Bearer sk-alice"}
    body = {"messages": url_message(picture_site + "/picture.png"), "max_tokens": 2}
    with KineticServer("-mm", str(tiny_projector("gemma3")), "-c", "2048", "-np", "1",
                       "--api-key-file", str(keys)) as server:
        refused = httpx.post(server.url + "/v1/chat/completions", json=body, headers=auth, timeout=60)
        assert refused.status_code == 400 and "private, loopback" in refused.json()["error"]["message"]
    with KineticServer("-mm", str(tiny_projector("gemma3")), "-c", "2048", "-np", "1",
                       "--api-key-file", str(keys), "--media-allow-private") as server:
        allowed = httpx.post(server.url + "/v1/chat/completions", json=body, headers=auth, timeout=60)
        assert allowed.status_code == 200, allowed.text


# ------------------------------------------------------------------ bad input, and nothing left behind


def test_a_broken_image_is_a_400_naming_its_part_and_frees_the_slot(gemma: KineticServer) -> None:
    not_an_image = base64.b64encode(b"this is no picture at all" * 10).decode()
    messages = [{"role": "user", "content": [{"type": "text", "text": "look"},
                                             {"type": "image_url", "image_url": {"url": data_url(b"x" * 40)}}]}]
    refused = chat(gemma.url, messages)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "messages[0].content[1].image_url.url"
    ollama_refused = httpx.post(gemma.url + "/api/chat", json={"model": "seer", "stream": False, "messages": [
        {"role": "user", "content": "look", "images": [not_an_image]}]}, timeout=60)
    assert ollama_refused.status_code == 400 and "image" in ollama_refused.json()["error"]
    assert idle(gemma.url)
    assert chat(gemma.url, image_message(png_image(64, 64, 41))).status_code == 200


def test_audio_is_refused_by_a_projector_that_only_sees(gemma: KineticServer) -> None:
    clip = base64.b64encode(wav_tone(0.5, 440.0)).decode()
    audio = {"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}}
    refused = chat(gemma.url, [{"role": "user", "content": [audio, {"type": "text", "text": "hear"}]}])
    assert refused.status_code == 400 and "audio" in refused.json()["error"]["message"]


def test_a_stream_with_an_image_cancelled_midway_leaves_nothing(gemma: KineticServer) -> None:
    body = {"messages": image_message(png_image(64, 64, 51)), "max_tokens": 200, "stream": True}
    with httpx.stream("POST", gemma.url + "/v1/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break
    deadline = time.monotonic() + 5
    while not idle(gemma.url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert idle(gemma.url)
    assert chat(gemma.url, image_message(png_image(64, 64, 51))).status_code == 200


# ------------------------------------------------------------------ the chat page


def test_chat_page_attaches_an_image_and_the_model_reads_it(gemma: KineticServer, tmp_path: Any) -> None:
    from tests.browser import ARTIFACTS, chromium_context

    picture = tmp_path / "screenshot.png"
    picture.write_bytes(png_image(96, 64, 71))
    bodies: list[dict[str, Any]] = []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with chromium_context() as context:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("request", lambda request: bodies.append(json.loads(request.post_data))
                if request.url.endswith("/v1/chat/completions") else None)
        page.goto(gemma.url + "/")
        page.wait_for_selector("#attach:not([hidden])", timeout=60_000)  # /props says the model sees
        page.set_input_files("#image-input", str(picture))
        page.wait_for_selector("#attachments img.thumb")
        page.fill("#max-tokens", "6")
        page.fill("#message", QUESTION)
        page.click("#send")
        turn = page.wait_for_selector(".turn.assistant:not(.streaming) .stats [data-name=prompt-tokens]",
                                      timeout=60_000)
        shown = int(turn.inner_text().split()[-1])
        assert page.query_selector(".turn.user img.thumb") is not None
        assert page.query_selector("#attachments").is_hidden()  # sent with this message only
        page.screenshot(path=str(ARTIFACTS / "chat-image.png"), full_page=True)
        assert not errors, errors
    content = bodies[0]["messages"][-1]["content"]
    assert content[0] == {"type": "text", "text": QUESTION}
    assert content[1]["type"] == "image_url" and content[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert shown >= GEMMA_IMAGE_TOKENS


# ------------------------------------------------------------------ audio, through an audio projector


def test_audio_reaches_a_model_with_an_audio_projector(model_lock: None) -> None:
    with KineticServer("-mm", str(tiny_projector("audio")), "-c", "2048", "-np", "1", "-a", "listener") as server:
        assert httpx.get(server.url + "/props").json()["modalities"] == {"vision": False, "video": False,
                                                                          "audio": True}
        clip = base64.b64encode(wav_tone(1.0, 440.0)).decode()
        heard = chat(server.url, [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}},
            {"type": "text", "text": "What do you hear?"}]}])
        assert heard.status_code == 200, heard.text
        assert heard.json()["usage"]["prompt_tokens"] >= 15  # one 30 s window: 15 embeddings
        other = chat(server.url, [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_tone(1.0, 880.0)).decode(),
                                                    "format": "wav"}}, {"type": "text", "text": "What do you hear?"}]}],
                     logprobs=True, top_logprobs=5, max_tokens=1)
        same = chat(server.url, [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}},
            {"type": "text", "text": "What do you hear?"}]}], logprobs=True, top_logprobs=5, max_tokens=1,
                    cache_prompt=False)
        assert other.json()["choices"][0]["logprobs"] != same.json()["choices"][0]["logprobs"]
        refused = chat(server.url, image_message(png_image(64, 64, 91)))
        assert refused.status_code == 400 and "does not read image" in refused.json()["error"]["message"]
