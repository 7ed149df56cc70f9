"""The few lines `kinetic serve` prints once it answers, after llama-server's `listening on` line (which scripts
read, so it stays as it is): where the chat page and the dashboard are, what is served, and one `curl` that
answers, so that a first run tells its user where to go."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

# the addresses that accept every interface: a browser on this machine reaches them at the loopback
ANY_HOSTS = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]"}
WELCOME_MAX_TOKENS = 100


@dataclass(frozen=True)
class Served:
    """What the lines say of the model: one model's name, context and slots, or a router's models."""

    name: str  # a router's: the model a request that names none gets ("" when it must name one)
    n_ctx: int = 0  # one slot's context, in tokens (0: a router, or a remote server's own)
    n_slots: int = 0
    router_models: int = 0  # a router: how many models it lists (loaded on first use)


def browsable(address: str) -> str:
    """A listening address as a browser on this machine opens it."""
    scheme, _, rest = address.partition("://")
    host, _, port = rest.rpartition(":")
    return f"{scheme}://{ANY_HOSTS.get(host, host)}:{port}"


def welcome_lines(address: str, served: Served, *, chat_page: bool, keyed: bool, api_prefix: str = "") -> list[str]:
    base = browsable(address)
    lines = []
    if chat_page:
        lines.append(f"chat page: {base}/" + ("  (it asks for your key)" if keyed else ""))
    if keyed:
        lines.append(f"dashboard: {base}/dashboard  (an admin key)")
    if served.router_models:
        default = (f"a request that names none gets {served.name}" if served.name
                   else "a request names one in its `model` field")
        lines.append(f"models: {served.router_models}, loaded on first use; {default}")
    elif served.n_ctx:
        lines.append(f"model: {served.name}, context {served.n_ctx} tokens in each of {served.n_slots} slot(s)")
    else:
        lines.append(f"model: {served.name}")
    # a cap: a small chat model sampled at its defaults now and then never says it is done, and a first try
    # that runs to the end of its context (minutes on a laptop) is not the one to show
    body = json.dumps({"messages": [{"role": "user", "content": "hello"}], "max_tokens": WELCOME_MAX_TOKENS})
    auth = ' -H "Authorization: Bearer $KEY"' if keyed else ""
    lines.append(f"try: curl {base}{api_prefix}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
                 f"-d {shlex.quote(body)}")
    return lines
