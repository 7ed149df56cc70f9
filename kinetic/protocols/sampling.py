"""Request fields every generation route shares: sampler settings, stops, limits, logit bias.

Kept apart from any one protocol so OpenAI, llama.cpp, Ollama and Anthropic routes validate and
default these fields the same way.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from kinetic.engine.types import SamplingParams
from kinetic.errors import InvalidRequestError, field_error, range_error
from kinetic.service import Service

MAX_TOP_LOGPROBS = 20


def check_range(field: str, value: float | int | None, low: float, high: float) -> None:
    if value is None:
        return
    if not (low <= value <= high) or (isinstance(value, float) and math.isnan(value)):
        raise range_error(field, low, high, value)


def check_finite(field: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise field_error(field, f"Value must be a finite number, but got {value}")


def stop_list(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    return tuple(s for s in stop if s)


def max_tokens_from(service: Service, candidates: Iterable[tuple[str, int | None]], *, minimum: int = 1) -> int:
    """The first limit the client set (named so an error can name it), else the server's -n."""
    for name, value in candidates:
        if value is None:
            continue
        if value < minimum and not (minimum == -1 and value == -1):
            raise field_error(name, f"Value must be >= {minimum}, but got {value}")
        return value
    return service.settings.n_predict


def logit_bias_from(service: Service, raw: dict[str, Any] | list[Any] | None) -> dict[int, float]:
    """OpenAI object form ({"15043": -100}) or llama.cpp array form ([[15043, -100], ["Hello", 2]]).
    Keys that are not integers are text: every token of it gets the bias. `false` bans the token."""
    if not raw:
        return {}
    items = raw.items() if isinstance(raw, dict) else [tuple(pair) for pair in raw if isinstance(pair, list) and len(pair) == 2]
    n_vocab = service.info.n_vocab
    bias: dict[int, float] = {}
    for key, value in items:
        if value is False:
            amount = float("-inf")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            amount = float(value)
        else:
            raise field_error("logit_bias", f"bias for {key!r} must be a number or false")
        if isinstance(key, int) or (isinstance(key, str) and key.lstrip("-").isdigit()):
            tokens = [int(key)]
        else:
            tokens = service.engine.tokenize(str(key), add_special=False, parse_special=False)
        for token in tokens:
            if 0 <= token < n_vocab:
                bias[token] = amount
    return bias


def sampling_from(service: Service, body: Any, *, grammar: str | None = None) -> SamplingParams:
    """SamplingParams out of a request model with llama.cpp/OpenAI sampler field names."""
    check_range("temperature", body.temperature, 0.0, 2.0)
    check_range("top_p", body.top_p, 0.0, 1.0)
    check_range("min_p", getattr(body, "min_p", None), 0.0, 1.0)
    check_range("presence_penalty", body.presence_penalty, -2.0, 2.0)
    check_range("frequency_penalty", body.frequency_penalty, -2.0, 2.0)
    repeat_penalty = getattr(body, "repeat_penalty", None)
    if repeat_penalty is None:
        repeat_penalty = getattr(body, "repetition_penalty", None)
    if repeat_penalty is not None and not (math.isfinite(repeat_penalty) and repeat_penalty > 0):
        raise InvalidRequestError("Failed to initialize samplers: penalty_repeat must be finite and greater than 0",
                                  param="repeat_penalty")
    defaults = service.default_sampling()
    values = {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": getattr(body, "top_k", None),
        "min_p": getattr(body, "min_p", None),
        "typical_p": getattr(body, "typical_p", None),
        "repeat_penalty": repeat_penalty,
        "repeat_last_n": getattr(body, "repeat_last_n", None),
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "seed": body.seed,
        "ignore_eos": getattr(body, "ignore_eos", None),
    }
    chosen = {k: v for k, v in values.items() if v is not None}
    if "top_k" in chosen:
        chosen["top_k"] = max(0, chosen["top_k"])
    if "repeat_last_n" in chosen and chosen["repeat_last_n"] < 0:
        raise range_error("repeat_last_n", 0, 2147483647, chosen["repeat_last_n"])
    return SamplingParams(
        temperature=chosen.get("temperature", defaults.temperature),
        top_k=chosen.get("top_k", defaults.top_k),
        top_p=chosen.get("top_p", defaults.top_p),
        min_p=chosen.get("min_p", defaults.min_p),
        typical_p=chosen.get("typical_p", defaults.typical_p),
        repeat_penalty=chosen.get("repeat_penalty", defaults.repeat_penalty),
        repeat_last_n=chosen.get("repeat_last_n", defaults.repeat_last_n),
        presence_penalty=chosen.get("presence_penalty", defaults.presence_penalty),
        frequency_penalty=chosen.get("frequency_penalty", defaults.frequency_penalty),
        seed=chosen.get("seed", defaults.seed),
        logit_bias=logit_bias_from(service, getattr(body, "logit_bias", None)),
        grammar=grammar,
        ignore_eos=bool(chosen.get("ignore_eos", False)),
    )
