"""scripts/server_abuse.py against a live server: each kind of abuse, then the server still answers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator

import pytest

from tests.server import KineticServer

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "server_abuse.py"
BODY_TIMEOUT_S = 2.0
HEADER_TIMEOUT_S = 2.0


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("server_abuse", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["server_abuse"] = module
    spec.loader.exec_module(module)
    return module


abuse = load_script()


@pytest.fixture(scope="module")
def target(model_lock: None, live_server: KineticServer) -> Iterator[object]:
    with KineticServer("-c", "2048", "-np", "2", "--body-timeout", str(BODY_TIMEOUT_S),
                       "--header-timeout", str(HEADER_TIMEOUT_S)) as server:
        yield abuse.Target(server.url, body_timeout=BODY_TIMEOUT_S, header_timeout=HEADER_TIMEOUT_S)


@pytest.mark.parametrize("description, check", abuse.CHECKS + abuse.LONG_CHECKS,
                         ids=[func.__name__ for _, func in abuse.CHECKS + abuse.LONG_CHECKS])
def test_server_survives(target: object, description: str, check: object) -> None:
    check(target)  # type: ignore[operator]
    assert abuse.healthy(target), f"not healthy after: {description}"
