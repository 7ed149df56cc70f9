"""The chat page shows a thinking model's reasoning folded, in Debian's chromium driven by Playwright.
The bundled base model never thinks, so the scripted engine (tests/scripted.py) plays a thinking
model's text behind the real app on real uvicorn. The page's other tests run against `kinetic serve`:
tests/e2e/test_web_pages.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser import ARTIFACTS, chromium_context
from tests.scripted import ScriptedEngine, ScriptedServer, wait_until_ready

TIMEOUT_MS = 60_000


@pytest.fixture()
def page() -> Iterator[Any]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with chromium_context() as context:
        context.set_default_timeout(TIMEOUT_MS)  # type: ignore[attr-defined]
        page = context.new_page()  # type: ignore[attr-defined]
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        yield page
        assert not errors, f"JavaScript errors on the page: {errors}"


def test_reasoning_is_shown_folded(page: Any) -> None:
    """The server splits a thinking model's text into reasoning_content; the page folds it."""
    engine = ScriptedEngine(["<think>", "Two and two ", "make four.", "</think>", "The answer ", "is 4."])
    with ScriptedServer(engine) as server:
        engine.loaded.set()
        wait_until_ready(server.url)
        page.goto(server.url + "/")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        page.check("#thinking")
        page.fill("#message", "What is 2 + 2?")
        page.click("#send")
        turn = page.wait_for_selector(".turn.assistant:not(.streaming) .stats [data-name=tokens-per-second]")
        assert page.inner_text(".turn.assistant .content") == "The answer is 4."
        reasoning = page.query_selector(".turn.assistant details.reasoning")
        assert reasoning.is_visible() and reasoning.get_attribute("open") is None  # folded
        assert page.evaluate("document.querySelector('.turn.assistant .reasoning pre').textContent") == \
            "Two and two make four."
        page.click(".turn.assistant .reasoning summary")
        assert page.is_visible(".turn.assistant .reasoning pre") and turn is not None
        page.screenshot(path=str(ARTIFACTS / "chat-reasoning.png"))
