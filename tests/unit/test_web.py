"""The web pages without a model: `/` content negotiation, the assets, who may read the dashboard,
and ClassStats (the dashboard's numbers) fed with ledger records."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kinetic.classroom.keys import KeyRing
from kinetic.classroom.ledger import LedgerRecord
from kinetic.classroom.roles import require_admin
from kinetic.classroom.stats import UNKNOWN, ClassStats, name_of
from kinetic.config.settings import ServerSettings
from kinetic.engine.llama import LlamaEngine
from kinetic.errors import ForbiddenError, UnauthorizedError
from kinetic.web.routes import OLLAMA_TEXT, wants_html
from tests.scripted import single_model_app

CHROME_ACCEPT = ("text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,"
                 "*/*;q=0.8,application/signed-exchange;v=b3;q=0.7")


def app_client(**settings: object) -> TestClient:
    engine = LlamaEngine(Path("unused.gguf"))
    app = single_model_app(ServerSettings(**settings), engine)
    return TestClient(app)  # not entered: the model never loads, pages still serve


@pytest.mark.parametrize(("accept", "html"), [
    (CHROME_ACCEPT, True),
    ("text/html", True),
    ("TEXT/HTML; charset=utf-8", True),
    ("*/*", False),  # curl, httpx, the ollama client
    ("", False),
    ("application/json", False),
    ("text/html;q=0, */*", False),
    ("text/plain, text/html;q=0.1", True),
])
def test_wants_html_only_when_text_html_is_asked_for(accept: str, html: bool) -> None:
    assert wants_html(accept) is html


def test_root_is_the_chat_page_for_browsers_and_ollama_text_for_the_rest() -> None:
    client = app_client(api_key="sk-secret")  # no key sent: the page needs none, even while loading
    page = client.get("/", headers={"Accept": CHROME_ACCEPT})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/ui/chat.js">' in page.text and "Accept" in page.headers["vary"]
    for accept in ("*/*", "application/json"):
        plain = client.get("/", headers={"Accept": accept})
        assert (plain.status_code, plain.text) == (200, OLLAMA_TEXT)
        assert plain.headers["content-type"].startswith("text/plain")
    head = client.head("/")
    assert head.status_code == 200 and head.text == ""
    assert client.get("/ui/chat.js").status_code == 200
    assert client.get("/ui/style.css").headers["content-type"].startswith("text/css")
    assert client.get("/ui/nothing.js").status_code == 404
    assert client.get("/ui/config.json").json() == {"api_key_required": True, "admin_key_required": True,
                                                    "chat_history": False}
    assert app_client().get("/ui/config.json").json() == {"api_key_required": False, "admin_key_required": False,
                                                          "chat_history": False}
    assert client.get("/ui/..%2Fsettings.py").status_code == 404


def test_no_ui_turns_the_chat_page_off_but_not_the_dashboard() -> None:
    client = app_client(ui=False)
    page = client.get("/", headers={"Accept": CHROME_ACCEPT})
    assert (page.status_code, page.text) == (200, OLLAMA_TEXT)
    assert client.get("/ui/chat.js").status_code == 404
    assert client.get("/dashboard").status_code == 200 and client.get("/ui/dashboard.js").status_code == 200


def test_only_the_pages_are_served_while_the_model_loads() -> None:
    client = app_client(api_key="sk-secret")
    assert client.get("/dashboard").status_code == 200  # the shell: every number is behind /dashboard/stats
    assert client.get("/dashboard/stats").status_code == 503  # then 401 without a key: tests/e2e/test_web_pages.py
    assert client.get("/props").status_code == 503


def key_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "keys.txt"
    path.write_text(text)
    return path


def check(ring: KeyRing, key: str | None) -> type[Exception] | None:
    try:
        require_admin(ring, key or "")
    except (UnauthorizedError, ForbiddenError) as exc:
        return type(exc)
    return None


def test_dashboard_access_admin_by_flag_or_by_name(tmp_path: Path) -> None:
    students = key_file(tmp_path, "sk-alice alice\nsk-bob bob\nsk-boss admin\n")
    ring = KeyRing(file=students)
    assert check(ring, "sk-boss") is None
    assert check(ring, "sk-alice") is ForbiddenError  # a student's valid key
    assert check(ring, "sk-nobody") is UnauthorizedError and check(ring, None) is UnauthorizedError

    flagged = KeyRing(file=key_file(tmp_path, "sk-alice alice\n"), admin="sk-root")
    assert check(flagged, "sk-root") is None and flagged.name_for("sk-root") == "admin"  # also an API key
    assert check(flagged, "sk-alice") is ForbiddenError

    no_admin = KeyRing(file=key_file(tmp_path, "sk-alice alice\n"))
    assert check(no_admin, "sk-alice") is ForbiddenError  # a key file and no admin: nobody

    inline = KeyRing("sk-1,sk-2")
    assert check(inline, "sk-2") is None and check(inline, "sk-3") is UnauthorizedError

    open_server = KeyRing()
    assert check(open_server, None) is None
    open_with_admin = KeyRing(admin="sk-root")
    assert not open_with_admin and open_with_admin.name_for("sk-root") is None  # the API stays open
    assert check(open_with_admin, "sk-root") is None and check(open_with_admin, None) is UnauthorizedError


def test_admin_key_flag() -> None:
    from kinetic.config.args import parse_serve_args

    assert parse_serve_args(["--admin-key", "sk-root"], environ={}).admin_key == "sk-root"
    assert parse_serve_args([], environ={"KINETIC_ADMIN_KEY": "sk-env"}).admin_key == "sk-env"
    assert parse_serve_args(["--no-ui"], environ={}).ui is False and parse_serve_args([], environ={}).ui


# ---------------------------------------------------------------------------------------------
# ClassStats

T0 = 1_800_000_000.0
TIMINGS = {"prompt_n": 20, "prompt_ms": 40.0, "cache_n": 5, "predicted_n": 50, "predicted_ms": 10_000.0}


def chat(client: str | None, *, stream: bool, status: int = 200, addr: str = "10.0.0.1",
         **extra: object) -> LedgerRecord:
    record = {"client": client, "auth": "ok" if client else "wrong", "addr": addr, "method": "POST",
              "route": "/v1/chat/completions", "status": status, "stream": stream}
    if status == 200:
        record.update(prompt_tokens=25, completion_tokens=50, timings=TIMINGS)
        if stream:
            record.update(chunks=50, ttft_s=0.5)
    return LedgerRecord.model_validate({**record, **extra})


def rows(stats: ClassStats, roster: tuple[str, ...] = ()) -> dict[str, dict]:
    return {row["name"]: row for row in stats.snapshot(roster, now=T0 + 60)["students"]}


def test_class_stats_per_key_totals_and_the_labs_requests() -> None:
    stats = ClassStats(clock=lambda: T0)
    stats.record(chat("alice", stream=True), now=T0 + 10)
    stats.record(chat("alice", stream=False), now=T0 + 20)
    stats.record(chat(None, stream=False, status=401), now=T0 + 30)  # alice's laptop, no key
    stats.record(chat("bob", stream=False, addr="10.0.0.2", status=400,
                      error={"type": "invalid_request_error", "message": "x"}), now=T0 + 40)
    by_name = rows(stats, ("alice", "bob", "carol"))
    assert list(by_name) == ["alice", "bob", "carol", UNKNOWN]
    alice = by_name["alice"]
    assert (alice["requests"], alice["prompt_tokens"], alice["completion_tokens"], alice["errors"]) == (2, 50, 100, 0)
    assert alice["mean_ttft_s"] == pytest.approx((0.5 + 0.04) / 2)  # stream: as seen; full: prompt time
    assert alice["lab"] == {"streamed_chat": True, "full_chat": True, "rejected_401": 1}
    assert alice["last"]["route"] == "/v1/chat/completions" and alice["last"]["status"] == 200
    bob = by_name["bob"]
    assert (bob["requests"], bob["errors"], bob["mean_ttft_s"]) == (1, 1, None)
    assert bob["lab"] == {"streamed_chat": False, "full_chat": False, "rejected_401": 0}
    assert by_name["carol"]["requests"] == 0 and by_name["carol"]["last"] is None
    assert by_name[UNKNOWN]["requests"] == 1 and by_name[UNKNOWN]["errors"] == 1
    stats.record(chat("bob", stream=True).model_copy(update={"prompt_tokens": None, "completion_tokens": None}),
                 now=T0 + 50)
    assert (rows(stats)["bob"]["prompt_tokens"], rows(stats)["bob"]["completion_tokens"]) == (25, 50)  # timings
    stopped = LedgerRecord(client="bob", auth="ok", addr="10.0.0.2", route="/v1/chat/completions", status=200,
                           stream=True, chunks=7, ttft_s=0.2)  # aborted by the client: no usage, no timings
    stats.record(stopped, now=T0 + 55)
    assert rows(stats)["bob"]["completion_tokens"] == 57 and rows(stats)["bob"]["lab"]["streamed_chat"]
    stats = ClassStats(clock=lambda: T0)
    for index, record in enumerate((chat("alice", stream=True), chat("alice", stream=False),
                                    chat(None, stream=False, status=401))):
        stats.record(record, now=T0 + index)
    totals = stats.snapshot(now=T0 + 60)["totals"]
    assert totals == {"requests": 3, "prompt_tokens": 50, "completion_tokens": 100, "errors": 1}


def test_class_stats_names_without_keys() -> None:
    assert name_of(LedgerRecord(client=None, auth="open", addr="10.0.0.7", status=200)) == "addr:10.0.0.7"
    assert name_of(LedgerRecord(client=None, auth="missing", status=200, route="/health")) is None
    assert name_of(LedgerRecord(client=None, auth="missing", status=401)) == UNKNOWN
    stats = ClassStats(clock=lambda: T0)
    stats.record(LedgerRecord(client=None, auth="missing", addr="10.0.0.1", status=200, route="/health"))
    assert stats.snapshot(now=T0)["students"] == []


def test_class_stats_tokens_per_second_spread_over_generation_time() -> None:
    stats = ClassStats(clock=lambda: T0, bucket_s=5, window_s=60)
    start = T0 - T0 % 5  # a bucket boundary
    stats.record(chat("alice", stream=True), now=start + 10)  # 50 tokens over the 10 s before
    points = stats.snapshot(now=start + 12)["throughput"]
    assert len(points) == 12 and points[-1]["t"] == start + 10
    assert [p["tokens_per_s"] for p in points[-4:]] == [0.0, 5.0, 5.0, 0.0]
    assert sum(p["tokens_per_s"] * 5 for p in points) == pytest.approx(50)
    later = stats.snapshot(now=start + 200)["throughput"]  # out of the window
    assert all(p["tokens_per_s"] == 0 for p in later)


def test_class_stats_is_a_sink_of_the_request_recorder(tmp_path: Path) -> None:
    """The same records reach the ledger file and the dashboard; the dashboard's polls reach neither."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from kinetic.classroom.ledger import LedgerMiddleware, LedgerWriter, read_ledger
    from tests.unit.test_classroom import NameGate  # the ledger tests' fake route
    from tests.unit.test_classroom import chat as chat_route

    keys = key_file(tmp_path, "sk-a alice\n")
    stats = ClassStats()
    app = Starlette(routes=[Route("/v1/chat/completions", chat_route, methods=["POST"]),
                            Route("/dashboard/stats", lambda request: JSONResponse({}), methods=["GET"])])
    app.add_middleware(NameGate, ring=KeyRing(file=keys))
    app.add_middleware(LedgerMiddleware, writer=LedgerWriter(tmp_path / "l.jsonl"), sinks=[stats], keyed=True)
    client = TestClient(app)
    alice = {"Authorization": "Bearer sk-a"}
    client.post("/v1/chat/completions", headers=alice, json={"messages": [], "stream": True})
    client.post("/v1/chat/completions", json={})
    client.get("/dashboard/stats", headers=alice)
    assert [r.status for r in read_ledger(tmp_path / "l.jsonl")] == [200, 401]
    by_name = {row["name"]: row for row in stats.snapshot(["alice"])["students"]}
    assert by_name["alice"]["requests"] == 1 and by_name["alice"]["lab"]["streamed_chat"]
    assert by_name[UNKNOWN]["requests"] == 1
