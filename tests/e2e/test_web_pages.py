"""The chat page and the dashboard in a real browser: Debian's chromium driven by Playwright, against
`kinetic serve` on the bundled model with a key file of two named students and an admin key.

Never skipped: without /usr/bin/chromium the tests fail and say how to install it (tests/browser.py).
Screenshots go to tests/artifacts/ (gitignored) for a person to look at.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.browser import ARTIFACTS, chromium_context
from tests.server import KineticServer

pytestmark = pytest.mark.e2e

KEYS = {"alice": "sk-alice-5d1e", "bob": "sk-bob-a0c3", "carol": "sk-carol-19b2"}
ADMIN_KEY = "sk-teacher-77f0"
ALIAS = "kinetic-web"
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def server(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KineticServer]:
    folder = tmp_path_factory.mktemp("web")
    keys = folder / "keys.txt"
    # alice has a budget, so the chat page's standing line has something to show
    keys.write_text("".join(f"{key} {name}{' tokens=100000/week' if name == 'alice' else ''}\n"
                            for name, key in KEYS.items()))
    with KineticServer("-c", "4096", "-np", "2", "-a", ALIAS, "--api-key-file", str(keys),
                       "--admin-key", ADMIN_KEY, "--chat-history", str(folder / "chats")) as server:
        yield server


@pytest.fixture(scope="module")
def browser_context() -> Iterator[Any]:
    """Debian's chromium on a fresh profile (tests/browser.py: a missing browser fails, naming the fix)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with chromium_context() as context:
        context.set_default_timeout(TIMEOUT_MS)  # type: ignore[attr-defined]
        yield context


@pytest.fixture()
def page(browser_context: Any) -> Iterator[Any]:
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    page.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def slots(server: KineticServer) -> list[dict[str, Any]]:
    return httpx.get(server.url + "/slots", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10).json()


def open_chat(page: Any, server: KineticServer, key: str) -> None:
    page.goto(server.url + "/")
    page.wait_for_selector("#key-form:not([hidden])")  # a keyed server: the page asks first
    page.fill("#key-form input", key)
    page.click("#key-form button")
    page.wait_for_function(f"document.getElementById('model').textContent === {json.dumps(ALIAS)}")


def numbers(turn: Any) -> dict[str, str]:
    return {span.get_attribute("data-name"): span.inner_text() for span in turn.query_selector_all(".stats span")}


def test_chat_page_streams_answers_with_their_numbers(page: Any, server: KineticServer) -> None:
    sent_bodies: list[dict[str, Any]] = []
    page.on("request", lambda request: sent_bodies.append(json.loads(request.post_data))
            if request.url.endswith("/v1/chat/completions") else None)
    open_chat(page, server, KEYS["alice"])
    assert page.inner_text("#ctx") == "n_ctx 2048"
    # the key lives in this tab's sessionStorage only
    assert page.evaluate("sessionStorage.getItem('kinetic.apiKey')") == KEYS["alice"]
    assert page.evaluate("localStorage.length") == 0 and not page.context.cookies()

    page.fill("#max-tokens", "24")
    for turn_index, message in enumerate(("Write a short poem about the sea.", "And one about the mountains.")):
        page.fill("#message", message)
        page.click("#send")
        turn = page.wait_for_selector(f".turn.assistant:nth-of-type({2 * turn_index + 2}):not(.streaming) "
                                      ".stats [data-name=tokens-per-second]").evaluate_handle(
            "node => node.closest('.turn')").as_element()
        shown = numbers(turn)
        assert turn.query_selector(".content").inner_text().strip(), "no answer text"
        prompt_tokens = int(shown["prompt-tokens"].split()[-1])
        cache_n = int(shown["cache-n"].split()[-1])
        assert prompt_tokens > 5 and 0 <= cache_n < prompt_tokens
        assert shown["ttft"].endswith(" ms") and int(shown["ttft"].split()[1]) >= 0
        assert float(shown["tokens-per-second"].split()[-1]) > 0
        assert 1 <= int(shown["completion-tokens"].split()[-1]) <= 24
        if turn_index == 1:  # the second turn re-sends the first: its prefix comes from the slot's cache
            assert cache_n > 0
    # the key's own standing (GET /v1/me), updated after each answer: the tokens both turns took are gone
    page.wait_for_function("/^alice · \\d+ of 100000 tokens left this week/.test("
                           "document.getElementById('standing').textContent)")
    left = int(page.inner_text("#standing").split(" · ")[1].split()[0])
    assert left < 100000
    page.screenshot(path=str(ARTIFACTS / "chat.png"), full_page=True)

    first, second = sent_bodies
    assert first["stream"] is True and first["max_tokens"] == 24 and first["model"] == ALIAS
    assert first["chat_template_kwargs"] == {"enable_thinking": False}
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]  # the conversation goes on


def saved_chats(page: Any, count: int) -> list[str]:
    """The labels of the history list once it shows `count` saved chats (its first entry is the heading)."""
    page.wait_for_function(f"document.querySelectorAll('#history option').length === {count + 1}")
    return [label.strip() for label in page.eval_on_selector_all("#history option", "os => os.map(o => o.text)")]


def test_a_student_finds_their_chats_again_on_another_pc(page: Any, browser_context: Any,
                                                          server: KineticServer) -> None:
    open_chat(page, server, KEYS["carol"])
    assert saved_chats(page, 0) == ["saved chats (0)"]
    page.fill("#max-tokens", "6")
    for message in ("What does cache_n count?", "And prompt_n?"):
        page.fill("#message", message)
        page.click("#send")
        count = 1 if message.startswith("What") else 2
        page.wait_for_function(f"document.querySelectorAll('.turn.assistant').length === {count} && "
                               "!document.querySelector('.turn.assistant.streaming')")
    answers = [turn.inner_text() for turn in page.query_selector_all(".turn.assistant .content")]
    # saved after each answer, and the list shows this chat
    page.wait_for_function("document.querySelector('#history').value !== '' && "
                           "document.querySelector('#history option:checked').text.includes(' 4 messages ')")
    assert saved_chats(page, 1)[1].startswith("What does cache_n count? · 4 messages · ")

    # Another PC: a new tab, which has none of this one's state (the key and the conversation live in the
    # tab's sessionStorage and memory; the page keeps nothing in localStorage or cookies)
    other = browser_context.new_page()
    open_chat(other, server, KEYS["carol"])
    assert other.evaluate("localStorage.length") == 0 and other.query_selector_all(".turn") == []
    saved_chats(other, 1)
    chat_id = other.eval_on_selector_all("#history option", "os => os[1].value")
    other.select_option("#history", chat_id)
    other.wait_for_function("document.querySelectorAll('.turn').length === 4")
    assert [t.inner_text().strip() for t in other.query_selector_all(".turn.user")] == [
        "What does cache_n count?", "And prompt_n?"]
    assert [t.inner_text() for t in other.query_selector_all(".turn.assistant .content")] == answers
    # the conversation goes on from where the other PC left it
    bodies: list[dict[str, Any]] = []
    other.on("request", lambda request: bodies.append(json.loads(request.post_data))
             if request.url.endswith("/v1/chat/completions") else None)
    other.fill("#max-tokens", "4")
    other.fill("#message", "Thanks")
    other.click("#send")
    other.wait_for_function("document.querySelectorAll('.turn.assistant:not(.streaming)').length === 3")
    assert [m["role"] for m in bodies[0]["messages"]] == ["user", "assistant"] * 2 + ["user"]
    other.close()
    # another student's page lists none of it, and the server refuses them the chat by its id
    other_student = browser_context.new_page()
    open_chat(other_student, server, KEYS["bob"])
    assert all("cache_n" not in label for label in saved_chats(other_student, len(
        httpx.get(server.url + "/chats", headers={"Authorization": f"Bearer {KEYS['bob']}"}).json()["data"])))
    other_student.close()
    assert httpx.get(f"{server.url}/chats/{chat_id}", headers={"Authorization": f"Bearer {KEYS['bob']}"}
                     ).status_code == 404
    # deleting it from the first PC removes it everywhere
    page.wait_for_function("document.querySelector('#history').value !== ''")
    page.click("#delete-chat")
    saved_chats(page, 0)
    assert page.query_selector_all(".turn") == []


def test_thinking_toggle_sets_enable_thinking(page: Any, server: KineticServer) -> None:
    bodies: list[dict[str, Any]] = []
    page.on("request", lambda request: bodies.append(json.loads(request.post_data))
            if request.url.endswith("/v1/chat/completions") else None)
    open_chat(page, server, KEYS["alice"])
    page.check("#thinking")
    page.fill("#max-tokens", "4")
    page.fill("#message", "Hello")
    page.click("#send")
    page.wait_for_selector(".turn.assistant:not(.streaming) .stats [data-name=tokens-per-second]")
    assert bodies[0]["chat_template_kwargs"] == {"enable_thinking": True}
    # The bundled base model does not think: the folded reasoning box stays hidden when empty.
    assert page.is_hidden(".turn.assistant .reasoning")


def test_stop_aborts_the_request_and_frees_the_slot(page: Any, browser_context: Any, server: KineticServer) -> None:
    open_chat(page, server, KEYS["bob"])
    page.fill("#max-tokens", "1800")
    page.click(".options summary")
    page.fill("#extra", '{"ignore_eos": true}')
    page.fill("#message", "Count from one to one thousand.")
    page.click("#send")
    # text is rendered while the answer is still streaming
    page.wait_for_function("(() => { const t = document.querySelector('.turn.assistant.streaming .content');"
                           " return t && t.textContent.length > 20; })()")
    busy = [slot for slot in slots(server) if slot["is_processing"]]
    assert [slot.get("key") for slot in busy] == ["bob"]
    page.screenshot(path=str(ARTIFACTS / "chat-streaming.png"))
    # meanwhile, on the instructor's dashboard (another tab: its own session storage), bob's slot is busy
    dashboard = browser_context.new_page()
    dashboard.goto(server.url + "/dashboard")
    dashboard.fill("#key-form input", ADMIN_KEY)
    dashboard.click("#key-form button")
    busy_row = dashboard.wait_for_selector("#slots tbody tr.processing")
    assert busy_row.query_selector_all("td")[2].inner_text() == "bob"
    dashboard.screenshot(path=str(ARTIFACTS / "dashboard-busy.png"), full_page=True)
    dashboard.close()
    page.click("#stop")
    page.wait_for_selector(".turn.assistant:not(.streaming) .stats [data-name=note]")
    deadline = time.monotonic() + 30
    while any(slot["is_processing"] for slot in slots(server)) and time.monotonic() < deadline:
        time.sleep(0.1)
    states = slots(server)
    assert not any(slot["is_processing"] for slot in states), states
    decoded = max(slot["next_token"][0]["n_decoded"] for slot in states if "next_token" in slot)
    assert decoded < 1800  # stopped long before max_tokens
    assert page.inner_text("#status").startswith("stopped") and page.is_enabled("#send")


def test_reloading_mid_answer_picks_the_answer_up_again(page: Any, server: KineticServer) -> None:
    sent: list[tuple[str, str, str | None]] = []
    page.on("request", lambda request: sent.append((request.method, request.url.split("?")[0],
                                                    request.headers.get("x-conversation-id"))))
    open_chat(page, server, KEYS["carol"])
    page.fill("#max-tokens", "250")  # seconds of answer after the reload, which takes well under one
    page.click(".options summary")
    page.fill("#extra", '{"ignore_eos": true}')
    page.fill("#message", "Count from one to one thousand.")
    page.click("#send")
    page.wait_for_function("(() => { const t = document.querySelector('.turn.assistant.streaming .content');"
                           " return t && t.textContent.length > 20; })()")
    before_reload = page.inner_text(".turn.assistant .content")
    page.reload()  # the key and the answer under way are in this tab's sessionStorage
    turn = page.wait_for_selector(".turn.assistant:not(.streaming) .stats [data-name=note]").evaluate_handle(
        "node => node.closest('.turn')").as_element()
    shown = numbers(turn)
    assert shown["note"].strip() == "resumed after a reload"
    assert int(shown["completion-tokens"].split()[-1]) == 250  # the reload did not cut the answer short
    answer = turn.query_selector(".content").inner_text()
    assert answer.startswith(before_reload.strip()) and len(answer) > len(before_reload)
    assert [t.inner_text() for t in page.query_selector_all(".turn.user")] == ["Count from one to one thousand."]
    assert page.inner_text("#status") == "ready" and page.is_enabled("#send")
    assert page.evaluate("sessionStorage.getItem('kinetic.pendingAnswer')") is None
    [(_, _, stream_id)] = [entry for entry in sent if entry[1].endswith("/v1/chat/completions")]
    assert stream_id, "the chat page sends X-Conversation-Id"
    assert ("GET", server.url + "/v1/stream", None) in sent  # the reloaded page read the kept stream
    assert not any(slot["is_processing"] for slot in slots(server))
    page.screenshot(path=str(ARTIFACTS / "chat-resumed.png"), full_page=True)


def test_dashboard_counts_requests_by_key_name(page: Any, server: KineticServer) -> None:
    from openai import AuthenticationError, OpenAI

    alice = OpenAI(base_url=server.url + "/v1", api_key=KEYS["alice"], max_retries=0, timeout=120)
    chunks = list(alice.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=8, stream=True))
    assert chunks
    bob = OpenAI(base_url=server.url + "/v1", api_key=KEYS["bob"], max_retries=0, timeout=120)
    bob.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=server.url + "/v1", api_key="sk-wrong", max_retries=0).models.list()

    page.goto(server.url + "/dashboard")
    page.wait_for_selector("#key-form:not([hidden])")
    page.fill("#key-form input", KEYS["alice"])  # a student's key is refused with a reason
    page.click("#key-form button")
    page.wait_for_function("document.querySelector('#key-form .key-message').textContent.includes('403')")
    assert page.is_hidden("#board")
    page.fill("#key-form input", ADMIN_KEY)
    page.click("#key-form button")
    page.wait_for_selector("#board:not([hidden]) #students tbody tr[data-name=alice]")
    assert page.evaluate("sessionStorage.getItem('kinetic.adminKey')") == ADMIN_KEY

    def row(name: str) -> dict[str, str]:
        cells = page.query_selector_all(f"#students tbody tr[data-name='{name}'] td")
        return {cell.get_attribute("class").split()[0]: cell.inner_text() for cell in cells}

    alice_row, bob_row, unknown = row("alice"), row("bob"), row("unknown")
    # alice only ever streams (the chat page does too); bob made a full chat
    assert int(alice_row["requests"]) >= 1 and alice_row["streamed-chat"] == "✓" and alice_row["full-chat"] == "–"
    assert int(alice_row["tokens-out"]) > 0 and alice_row["ttft"].endswith("ms")
    assert int(bob_row["requests"]) >= 1 and bob_row["full-chat"] == "✓"
    # only the wrong key above: opening the pages asks for the key before any API call
    assert int(unknown["requests"]) == 1 and int(unknown["errors"]) == 1
    assert alice_row["rejected"].startswith("✓")  # the 401 came from the address alice uses
    assert len(page.query_selector_all("#slots tbody tr")) == 2
    assert page.query_selector("#chart polyline").get_attribute("points")
    html = page.content()
    assert not any(key in html for key in (*KEYS.values(), ADMIN_KEY)), "a key is shown on the dashboard"
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

    before = int(row("bob")["requests"])
    bob.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "Again"}], max_tokens=4)
    page.wait_for_function("Number(document.querySelector(\"#students tr[data-name='bob'] td.requests\")"
                           f".textContent) === {before + 1}")  # refreshed live


def test_root_answers_ollama_probes_and_dashboard_data_needs_the_admin(server: KineticServer) -> None:
    probe = httpx.get(server.url + "/")
    assert (probe.status_code, probe.text) == (200, "Ollama is running")
    head = httpx.head(server.url + "/")
    assert head.status_code == 200 and head.content == b"" and head.headers["content-type"].startswith("text/plain")
    assert httpx.get(server.url + "/", headers={"Accept": "text/html"}).text.startswith("<!doctype html>")
    stats = server.url + "/dashboard/stats"
    assert httpx.get(stats).status_code == 401
    denied = httpx.get(stats, headers={"Authorization": f"Bearer {KEYS['bob']}"})
    assert denied.status_code == 403 and denied.json()["error"]["type"] == "permission_error"
    body = httpx.get(stats, headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
    assert [m["name"] for m in body["models"]] == [ALIAS] and body["models"][0]["n_ctx"] == 2048
    assert [s["name"] for s in body["students"]][:2] == ["alice", "bob"]
    assert body["queue"]["deferred"] == 0 and len(body["slots"]) == 2


def test_router_mode_the_student_picks_the_model(page: Any, browser_context: Any, model_lock: None,
                                                  server: KineticServer) -> None:
    """Several models at one address: the page lists them (/v1/models), the request names the one
    picked, and the dashboard (open: this server has no keys) shows that model's slots."""
    from kinetic.backends.bundled import gemma_model_path

    gemma = str(gemma_model_path())
    server.stop()  # one model process at a time on this machine: the keyed server is not needed any more
    with KineticServer("-c", "2048", "-np", "1", "-m", gemma, "-a", "chat-a", "-m", gemma, "-a", "chat-b") as router:
        bodies: list[dict[str, Any]] = []
        page.on("request", lambda request: bodies.append(json.loads(request.post_data))
                if request.url.endswith("/v1/chat/completions") else None)
        page.goto(router.url + "/")
        page.wait_for_selector("#model-select:not([hidden])")
        assert [o.inner_text() for o in page.query_selector_all("#model-select option")] == ["chat-a", "chat-b"]
        page.select_option("#model-select", "chat-b")
        page.fill("#max-tokens", "8")
        page.fill("#message", "Hello")
        page.click("#send")
        page.wait_for_selector(".turn.assistant:not(.streaming) .stats [data-name=tokens-per-second]")
        assert bodies[0]["model"] == "chat-b"
        page.screenshot(path=str(ARTIFACTS / "chat-router.png"))
        dashboard = browser_context.new_page()
        dashboard.goto(router.url + "/dashboard")
        dashboard.wait_for_selector("#board:not([hidden]) #slots tbody tr")
        assert dashboard.inner_text("#model") == "chat-b"  # only the model that was loaded by the request
        assert dashboard.inner_text("#slots tbody tr td") == "0"
        student = dashboard.query_selector("#students tbody tr")
        assert student.get_attribute("data-name") == "addr:127.0.0.1"  # no keys: the address stands in
        dashboard.close()
