"""A pool member's load as the member itself counts it, read with each health probe.

kinetic counts what it sent to a member, but a member may serve others too (a second kinetic, a
student pointed straight at it): its own figures say how busy it is. llama-server and kinetic give
them at `/metrics` (`llamacpp:requests_processing`, `llamacpp:requests_deferred`, with `--metrics`)
and at `/slots` (a slot each, `is_processing`; on by default); vLLM at `/metrics`
(`vllm:num_requests_running`, `vllm:num_requests_waiting`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import httpx

Source = Literal["metrics", "slots"]
SOURCES: tuple[Source, ...] = ("metrics", "slots")
RUNNING = ("llamacpp:requests_processing", "vllm:num_requests_running")
WAITING = ("llamacpp:requests_deferred", "vllm:num_requests_waiting")


@dataclass(frozen=True)
class LoadReading:
    processing: int
    deferred: int
    source: Source
    slots: int | None = None  # how many the member has, where it says (/slots)

    @property
    def busy(self) -> int:
        return self.processing + self.deferred

    def to_dict(self) -> dict[str, int | str | None]:
        return {"processing": self.processing, "deferred": self.deferred, "slots": self.slots,
                "source": self.source}


def from_metrics(text: str) -> LoadReading | None:
    """Prometheus text: the running and waiting gauges, summed over their labels (vLLM labels by model)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0].strip()
        if name in RUNNING or name in WAITING:
            try:
                values[name] = values.get(name, 0.0) + float(value)
            except ValueError:
                continue
    if not any(name in values for name in RUNNING):
        return None
    return LoadReading(processing=int(sum(values.get(n, 0.0) for n in RUNNING)),
                       deferred=int(sum(values.get(n, 0.0) for n in WAITING)), source="metrics")


def from_slots(body: bytes) -> LoadReading | None:
    try:
        slots = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
        return None
    return LoadReading(processing=sum(bool(s.get("is_processing")) for s in slots), deferred=0, source="slots",
                       slots=len(slots))


async def read_load(client: httpx.AsyncClient, root: str, headers: dict[str, str], model: str, *,
                    first: Source | None, timeout: float) -> LoadReading | None:
    """The member's figures from the route that gave them last time (`first`), else from each in turn;
    None when none answers with them (an OpenAI-only server without metrics)."""
    order = [first] if first else []
    order += [source for source in SOURCES if source != first]
    for source in order:
        try:
            response = await client.get(f"{root}/{source}", params={"model": model}, headers=headers,
                                        timeout=timeout)
        except httpx.HTTPError:
            return None  # it answered /models a moment ago: a slow member, read again next time
        if not response.is_success:
            continue
        reading = from_metrics(response.text) if source == "metrics" else from_slots(response.content)
        if reading is not None:
            return reading
    return None
