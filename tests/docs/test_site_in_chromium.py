"""The built course site, served locally and opened in headless Chromium with the network cut off,
as a student in an offline classroom sees it: the lab page renders its code annotations and its
sequence diagram (mermaid, shipped with the site), with one title. Screenshots go to tests/artifacts/.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.browser import ARTIFACTS, chromium_context, serve_directory

ROOT = Path(__file__).resolve().parents[2]
MERMAID = ROOT / "docs" / "assets" / "javascripts" / "mermaid.min.js"
# mkdocs-material renders each diagram into a closed shadow root; opening it lets the test look inside.
SVG_TEXT = "svg => [...svg.querySelectorAll('text')].map(t => t.textContent).join('\\n')"
OPEN_SHADOW_ROOTS = """
const attach = Element.prototype.attachShadow;
Element.prototype.attachShadow = function (init) { return attach.call(this, { ...init, mode: "open" }); };
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    target = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(target)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    with serve_directory(target) as url:
        yield url


def test_mermaid_is_shipped_with_the_site() -> None:
    """mkdocs-material 9 loads mermaid 11 from a CDN unless the page already has it."""
    assert MERMAID.is_file(), "run scripts/update_mermaid.sh to ship mermaid with the site"
    assert re.search(r'version:"11\.\d+\.\d+"', MERMAID.read_text(encoding="utf-8")[:4_000_000])


def open_offline(context, url: str, outside: list[str]):
    """A page whose every request to another host is refused (and recorded)."""
    page = context.new_page()
    page.add_init_script(OPEN_SHADOW_ROOTS)
    local = urlparse(url).netloc

    def route(request_route) -> None:
        if urlparse(request_route.request.url).netloc == local:
            request_route.continue_()
        else:
            outside.append(request_route.request.url)
            request_route.abort()

    page.route("**/*", route)
    return page


def test_lab_page_renders_annotations_and_diagram_offline(site: str) -> None:
    outside: list[str] = []
    errors: list[str] = []
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium_context() as context:
        page = open_offline(context, site, outside)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{site}/labs/lab-04-02/")
        # the title once: the page's own heading is the lab README's
        assert page.locator("article h1").all_inner_texts() == ["Lab 04-02: OpenAI-compatible clients"]
        page.screenshot(path=str(ARTIFACTS / "lab-04-02-top.png"))  # what a student sees first

        # code annotations: the three markers of chat.py's key lines became (1) (2) (3) buttons
        page.wait_for_selector(".md-annotation", timeout=30_000)
        annotated = page.locator(".highlight", has=page.locator(".md-annotation")).first
        assert "OpenAI(base_url=BASE_URL" in annotated.inner_text()
        assert page.locator(".md-annotation__index").count() == 3
        annotated.locator(".md-annotation__index").nth(1).click()
        tooltip = annotated.locator(".md-annotation").nth(1).locator(".md-tooltip__inner")
        tooltip.wait_for(state="visible", timeout=10_000)
        assert "extra_body" in tooltip.inner_text()
        box = annotated.bounding_box()
        page.screenshot(path=str(ARTIFACTS / "lab-04-02-annotation.png"),
                        clip={"x": 0, "y": box["y"] - 40, "width": 1280, "height": box["height"] + 240})

        # the sequence diagram: an SVG drawn by the mermaid shipped with the site, no CDN
        diagram = page.locator(".mermaid svg").first
        diagram.wait_for(timeout=30_000)
        labels = diagram.evaluate(SVG_TEXT)
        assert "chat.py (openai SDK)" in labels and "kinetic serve" in labels and "data: [DONE]" in labels
        assert diagram.bounding_box()["height"] > 200
        diagram.scroll_into_view_if_needed()
        page.locator(".mermaid").first.screenshot(path=str(ARTIFACTS / "lab-04-02-diagram.png"))
        page.screenshot(path=str(ARTIFACTS / "lab-04-02.png"), full_page=True)
        assert page.locator("pre.mermaid code").count() == 0, "a diagram was left as a code block"
    assert not errors, errors
    assert outside == [], f"the site reached outside the classroom: {outside}"


def test_every_page_draws_its_diagrams_offline(site: str) -> None:
    """Any page with a mermaid fence gets an SVG; the home page has the request-flow diagram."""
    outside: list[str] = []
    with chromium_context() as context:
        page = open_offline(context, site, outside)
        page.goto(f"{site}/")
        page.locator(".mermaid svg").first.wait_for(timeout=30_000)
        assert "translate.py" in page.locator(".mermaid svg").first.evaluate(SVG_TEXT)
    assert outside == [], f"the site reached outside the classroom: {outside}"


@pytest.mark.parametrize(("slug", "title", "diagram", "annotated"), [
    ("lab-04-03", "Lab 04-03: structured output and tool calls", "tools.py (openai SDK)", "response_format=Citta"),
    ("lab-04-04", "Lab 04-04: one server, many clients", "kinetic serve (-np 2)", "ThreadPoolExecutor"),
    ("lab-04-05", "Lab 04-05: images and the projector", "see.py (openai SDK)", "data_url(image)"),
])
def test_module_04_lab_pages_render_offline(site: str, slug: str, title: str, diagram: str, annotated: str) -> None:
    """Labs 04-03, 04-04 and 04-05: one title, the annotated code of their scripts, the sequence diagram drawn."""
    outside: list[str] = []
    errors: list[str] = []
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium_context() as context:
        page = open_offline(context, site, outside)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{site}/labs/{slug}/")
        assert page.locator("article h1").all_inner_texts() == [title]
        page.wait_for_selector(".md-annotation", timeout=30_000)
        block = page.locator(".highlight", has=page.locator(".md-annotation")).first
        assert annotated in block.inner_text() and block.locator(".md-annotation__index").count() >= 3
        svg = page.locator(".mermaid svg").first
        svg.wait_for(timeout=30_000)
        assert diagram in svg.evaluate(SVG_TEXT)
        page.screenshot(path=str(ARTIFACTS / f"{slug}.png"), full_page=True)
        assert page.locator("pre.mermaid code").count() == 0
    assert not errors, errors
    assert outside == [], f"the site reached outside the classroom: {outside}"
