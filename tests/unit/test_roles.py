"""Roles on a keyed server: every route the app registers, walked with no key, a student's key and the
admin key, against the table in docs/reference/routes.md; what a student sees of the others; slot files."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from kinetic.classroom.keys import KeyRing
from kinetic.classroom.roles import ADMIN_ROUTES, Role, needs_admin, role_of
from kinetic.config.settings import ServerSettings
from kinetic.engine.types import EngineStats, GenerationRequest, SlotState
from kinetic.errors import InsufficientStorageError, InvalidRequestError
from kinetic.protocols.llamacpp import metrics, server_state
from kinetic.protocols.llamacpp.slot_folder import check_room, slot_path
from tests.scripted import ReadyClient, ScriptedEngine, single_model_app

ROUTES_DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "routes.md"
STUDENT, ADMIN = "sk-alice", "sk-teacher"
WHO = ("anyone", "student", "admin")


def route_table() -> dict[tuple[str, str], str]:
    """(method, route) -> who may call it, from the docs' table."""
    table: dict[tuple[str, str], str] = {}
    for line in ROUTES_DOC.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^\| ([A-Z, ]+) \| `([^`]+)` \| (\w+)", line)
        if match is None:
            continue
        methods, route, who = match.groups()
        assert who in WHO, line
        for method in methods.split(","):
            table[(method.strip(), route)] = who
    return table


def registered_routes(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(method, path template) of every route the app serves, through included routers."""
    for route in routes:
        if hasattr(route, "original_router"):  # FastAPI 0.165+ keeps an included router whole
            yield from registered_routes(route.original_router.routes, prefix + route.include_context.prefix)
        elif isinstance(route, APIRoute):
            for method in route.methods:
                yield method, prefix + route.path
        else:
            raise AssertionError(f"unknown route type {route!r}: teach this test about it")


def keyed_app(tmp_path: Path, **settings: Any) -> ReadyClient:
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{STUDENT} alice\nsk-bob bob\n", encoding="utf-8")
    loaded = threading.Event()
    loaded.set()
    engine = ScriptedEngine(["hi"], loaded=loaded)
    return ReadyClient(single_model_app(ServerSettings(api_key_file=str(keys), admin_key=ADMIN, metrics=True,
                                                      ui_mcp_proxy=True, slot_save_path=str(tmp_path / "slots"),
                                                      **settings), engine, "scripted"))


def call(client: TestClient, method: str, template: str, key: str | None) -> Any:
    path = re.sub(r"\{[^}]*\}", "0", template)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"json": {}} if method == "POST" else {}
    return client.request(method, path, headers=headers, **body)


def test_the_docs_table_lists_every_route_and_each_answers_as_it_says(tmp_path: Path) -> None:
    table = route_table()
    with keyed_app(tmp_path) as client:
        registered = set(registered_routes(client.app.routes))  # type: ignore[attr-defined]
        assert registered == set(table), (f"missing from the docs: {sorted(registered - set(table))}; "
                                          f"in the docs only: {sorted(set(table) - registered)}")
        refused_to_student = allowed_to_admin = 0
        for (method, route), who in sorted(table.items()):
            assert needs_admin(method, re.sub(r"\{[^}]*\}", "0", route)) == (who == "admin"), (method, route)
            anonymous = call(client, method, route, None)
            student = call(client, method, route, STUDENT)
            admin = call(client, method, route, ADMIN)
            assert admin.status_code not in (401, 403), (method, route, admin.text[:200])
            allowed_to_admin += 1
            if who == "anyone":
                assert anonymous.status_code not in (401, 403) and student.status_code not in (401, 403), route
            else:
                assert anonymous.status_code == 401, (method, route, anonymous.status_code)
            if who == "student":
                assert student.status_code not in (401, 403), (method, route, student.text[:200])
            if who == "admin":
                refused_to_student += 1
                assert student.status_code == 403, (method, route, student.status_code)
                if method != "HEAD":
                    assert "needs the admin key" in error_message(route, student.json()), student.text
    print(f"role walk: {refused_to_student} of {len(table)} routes refused to a student, "
          f"{allowed_to_admin} allowed to the admin")
    assert refused_to_student == len(ADMIN_ROUTES)


def error_message(route: str, body: dict[str, Any]) -> str:
    """The message of an error body in the route's protocol's own shape."""
    if route.startswith("/api/"):
        return body["error"]  # Ollama: {"error": "..."}
    if route.startswith("/v1/messages"):
        assert body["type"] == "error"
        return body["error"]["message"]
    assert body["error"]["code"] == 403 and body["error"]["type"] == "permission_error"
    return body["error"]["message"]


def test_a_student_is_refused_in_the_protocols_error_shape(tmp_path: Path) -> None:
    with keyed_app(tmp_path) as client:
        student = {"Authorization": f"Bearer {STUDENT}"}
        erase = client.post("/slots/0?action=erase", headers=student)
        assert erase.status_code == 403
        assert erase.json()["error"]["message"].startswith("this route needs the admin key")
        unload = client.post("/models/unload", headers=student, json={"model": "scripted"})
        assert unload.status_code == 403 and "admin key" in unload.json()["error"]["message"]
        stats = client.get("/dashboard/stats", headers=student)
        assert stats.status_code == 403
        assert client.get("/dashboard/stats", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200


def test_without_any_key_everything_is_open(tmp_path: Path) -> None:
    loaded = threading.Event()
    loaded.set()
    app = single_model_app(ServerSettings(metrics=True, ui_mcp_proxy=True), ScriptedEngine(["hi"], loaded=loaded),
                           "scripted")
    with ReadyClient(app) as client:
        for method, route in sorted(set(registered_routes(client.app.routes))):  # type: ignore[attr-defined]
            assert call(client, method, route, None).status_code not in (401, 403), (method, route)


def test_roles_of_each_kind_of_server(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-a alice\nsk-boss admin\n", encoding="utf-8")
    with_file = KeyRing(file=keys)
    assert role_of(with_file, "sk-a") is Role.STUDENT and role_of(with_file, "sk-boss") is Role.ADMIN
    assert role_of(KeyRing(), "") is Role.ADMIN  # a laptop alone: open, as llama-server
    assert role_of(KeyRing("sk-1,sk-2"), "sk-2") is Role.ADMIN  # --api-key alone: llama-server's operator key
    assert role_of(KeyRing("sk-1", admin="sk-root"), "sk-1") is Role.STUDENT
    assert role_of(KeyRing(admin="sk-root"), "") is Role.STUDENT  # the API open, management not
    assert role_of(KeyRing(admin="sk-root"), "sk-root") is Role.ADMIN
    file_only = tmp_path / "students.txt"
    file_only.write_text("sk-a alice\n", encoding="utf-8")
    assert role_of(KeyRing(file=file_only), "sk-a") is Role.STUDENT  # no admin: nobody manages


def test_a_student_sees_only_their_own_slot_and_metrics_line() -> None:
    request = GenerationRequest(prompt_tokens=[1, 2, 3], client="bob")
    states = [SlotState(id=0, is_processing=True, used=True, n_prompt_tokens=3, n_prompt_tokens_processed=3,
                        n_prompt_tokens_cache=0, n_decoded=1, client="bob", request=request),
              SlotState(id=1, is_processing=True, used=True, n_prompt_tokens=3, n_prompt_tokens_processed=3,
                        n_prompt_tokens_cache=0, n_decoded=1, client="alice",
                        request=GenerationRequest(prompt_tokens=[1], client="alice"))]
    bobs, alices = server_state.slots(states, 1024, viewer="alice")
    assert "key" not in bobs and "params" not in bobs and "bob" not in str(bobs)
    assert bobs["is_processing"] and bobs["n_prompt_tokens"] == 3  # busy, and the counts
    assert alices["key"] == "alice" and "params" in alices
    everything = server_state.slots(states, 1024)  # the admin
    assert everything[0]["key"] == "bob" and "params" in everything[0]
    stats = EngineStats(counters={}, requests_processing=2, requests_deferred=3,
                        deferred_by_client={"alice": 1, "bob": 2})
    seen_by_alice = metrics.metrics_text(stats, viewer="alice")
    assert 'key="alice"} 1' in seen_by_alice and "bob" not in seen_by_alice
    assert 'key="bob"} 2' in metrics.metrics_text(stats)


def test_slot_files_stay_in_their_folder_under_a_size_cap(tmp_path: Path) -> None:
    folder = tmp_path / "slots"
    folder.mkdir()
    assert slot_path(folder, "a.bin") == (folder / "a.bin").resolve()
    (folder / "escape").symlink_to(tmp_path)
    with pytest.raises(InvalidRequestError):
        slot_path(folder / "escape", "..")
    for bad in ("../x", "/etc/passwd", "..", "a/b", "C:x"):
        with pytest.raises(InvalidRequestError):
            server_state.slot_filename(bad)
    (folder / "old.bin").write_bytes(b"x" * (1024 * 1024))
    check_room(folder, 2)  # 1 MiB of 2: room
    new = folder / "new.bin"
    new.write_bytes(b"x" * (1024 * 1024 + 1))
    with pytest.raises(InsufficientStorageError, match="--slot-save-max 2 MiB"):
        check_room(folder, 2, new)
    assert not new.exists() and (folder / "old.bin").exists()  # the refused save is gone, the rest stays
    check_room(folder, 0)  # 0: no cap


def test_a_save_past_the_cap_is_refused_with_507(tmp_path: Path) -> None:
    with keyed_app(tmp_path, slot_save_max=1) as client:
        slots = tmp_path / "slots"
        slots.mkdir()
        (slots / "big.bin").write_bytes(b"x" * (2 * 1024 * 1024))
        answer = client.post("/slots/0?action=save", headers={"Authorization": f"Bearer {ADMIN}"},
                             json={"filename": "more.bin"})
        assert answer.status_code == 507 and "--slot-save-max" in answer.json()["error"]["message"]
        escape = client.post("/slots/0?action=save", headers={"Authorization": f"Bearer {ADMIN}"},
                             json={"filename": "../x.bin"})
        assert escape.status_code == 400 and escape.json()["error"]["param"] == "filename"
