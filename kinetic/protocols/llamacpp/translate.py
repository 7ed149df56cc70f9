"""llama-server native JSON: /completion requests inward, results and stream events, /props,
/slots and /metrics outward. Pure: the routes read the engine's state and hand it in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kinetic.chat.types import OutputConstraint, PromptRequest
from kinetic.engine.base import Tokenizer
from kinetic.engine.types import EngineStats, Finished, GenerationRequest, SlotState, TextDelta
from kinetic.errors import KineticError
from kinetic.protocols.common import translate as common
from kinetic.protocols.common.translate import logprob_entry
from kinetic.protocols.llamacpp.types import CompletionRequest, DetokenizeRequest, TokenizeRequest
from kinetic.service import Service
from kinetic.streaming import sse_data


def error_body(err: KineticError) -> dict[str, Any]:
    return {"error": {"code": err.status, "message": err.message, "type": err.kind, **err.extra}}


@dataclass
class NativeContext:
    model: str
    n_probs: int
    return_tokens: bool
    prompt_text: str
    generation_settings: dict[str, Any]


def generation_settings(request: GenerationRequest) -> dict[str, Any]:
    s = request.sampling
    return {"seed": s.seed if s.seed >= 0 else 4294967295, "temperature": s.temperature, "top_k": s.top_k,
            "top_p": s.top_p, "min_p": s.min_p, "typical_p": s.typical_p, "repeat_last_n": s.repeat_last_n,
            "repeat_penalty": s.repeat_penalty, "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty, "max_tokens": request.max_tokens,
            "n_predict": request.max_tokens, "n_probs": request.n_probs, "ignore_eos": s.ignore_eos,
            "stop": list(request.stop), "grammar": s.grammar or "",
            "logit_bias": [{"bias": b, "token": t} for t, b in s.logit_bias.items()]}


def to_prompt_request(req: CompletionRequest) -> PromptRequest:
    if req.n_probs is not None and req.n_probs < 0:
        common.check_range("n_probs", req.n_probs, 0, 2147483647)
    max_tokens = common.max_tokens_from([("n_predict", req.n_predict),
                                         ("max_completion_tokens", req.max_completion_tokens),
                                         ("max_tokens", req.max_tokens)], minimum=-1)
    output = OutputConstraint(grammar=req.grammar, schema=req.json_schema,
                              param="json_schema" if req.json_schema is not None else "grammar")
    return PromptRequest(prompt=common.prompt_input(req.prompt),
                         options=common.generation_options(req, max_tokens=max_tokens, n_probs=req.n_probs or 0),
                         output=output)


def native_context(req: CompletionRequest, generation: GenerationRequest, *, model: str,
                   prompt_text: str) -> NativeContext:
    return NativeContext(model=model, n_probs=generation.n_probs, return_tokens=bool(req.return_tokens),
                         prompt_text=prompt_text, generation_settings=generation_settings(generation))


def _final(finished: Finished, ctx: NativeContext, *, content: str, tokens: list[int]) -> dict[str, Any]:
    return {
        "index": 0, "content": content, "tokens": tokens, "id_slot": finished.id_slot, "stop": True,
        "model": ctx.model, "tokens_predicted": finished.usage.completion_tokens,
        "tokens_evaluated": finished.usage.prompt_tokens, "generation_settings": ctx.generation_settings,
        "prompt": ctx.prompt_text, "has_new_line": "\n" in finished.text, "truncated": finished.truncated,
        "stop_type": finished.stop_type, "stopping_word": finished.stopping_word,
        "tokens_cached": finished.tokens_cached, "timings": finished.timings.to_dict(),
    }


def to_completion(deltas: list[TextDelta], finished: Finished, ctx: NativeContext) -> dict[str, Any]:
    body = _final(finished, ctx, content=finished.text, tokens=finished.tokens if ctx.return_tokens else [])
    if ctx.n_probs:
        body["completion_probabilities"] = [logprob_entry(d.logprob, ctx.n_probs) for d in deltas if d.logprob]
    return body


class NativeEncoder:
    """/completion stream: one `data:` event per token, a final event with everything; no [DONE]."""

    def __init__(self, ctx: NativeContext):
        self.ctx = ctx
        self.n_predicted = 0

    def encode(self, event: TextDelta | Finished) -> list[bytes]:
        if isinstance(event, Finished):
            return [sse_data(_final(event, self.ctx, content="", tokens=[]))]
        self.n_predicted += 1
        chunk: dict[str, Any] = {"index": 0, "content": event.text, "tokens": [event.token_id], "stop": False,
                                 "id_slot": -1, "tokens_predicted": self.n_predicted}
        if event.logprob is not None and self.ctx.n_probs:
            chunk["completion_probabilities"] = [logprob_entry(event.logprob, self.ctx.n_probs)]
        return [sse_data(chunk)]

    def error(self, err: KineticError) -> list[bytes]:
        """llama-server ends a failed stream with one error event and no terminator of its own."""
        return [sse_data(error_body(err))]


def router_props(*, max_instances: int, autoload: bool, build_info: str) -> dict[str, Any]:
    """GET /props of a router asked for no model in particular (llama-server's router answer)."""
    return {"role": "router", "max_instances": max_instances, "models_autoload": autoload,
            "model_alias": "kinetic", "model_path": "none",
            "default_generation_settings": {"params": {}, "n_ctx": 0}, "build_info": build_info,
            "cors_proxy_enabled": False}


def props(service: Service) -> dict[str, Any]:
    engine = service.engine
    info = service.info
    defaults = generation_settings(GenerationRequest(prompt_tokens=[], sampling=service.default_sampling(),
                                                     max_tokens=service.settings.n_predict))
    for key in ("stop", "logit_bias", "grammar"):
        defaults.pop(key)
    template = service.template
    return {
        "default_generation_settings": {"n_ctx": engine.slot_n_ctx, "params": defaults},
        "total_slots": engine.n_slots,
        "model_alias": service.model_name,
        "model_ftype": info.ftype,
        "model_path": str(info.path),
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": service.settings.slots,
        "endpoint_props": False,
        "endpoint_metrics": service.settings.metrics,
        "chat_template": template.source if template else "",
        "chat_template_origin": template.origin if template else "",
        "chat_template_caps": {"supports_tools": True, "supports_parallel_tool_calls": False},
        "bos_token": info.bos_token,
        "eos_token": info.eos_token,
        "build_info": service.system_fingerprint,
        "is_sleeping": False,
    }


def slots(states: list[SlotState], n_ctx: int) -> list[dict[str, Any]]:
    result = []
    for slot in states:
        entry: dict[str, Any] = {"id": slot.id, "n_ctx": n_ctx, "speculative": False,
                                 "is_processing": slot.is_processing}
        if slot.is_processing:
            entry["key"] = slot.client  # whose request it is: a key's name, never the key
        if slot.used:
            entry.update(n_prompt_tokens=slot.n_prompt_tokens, n_prompt_tokens_processed=slot.n_prompt_tokens_processed,
                         n_prompt_tokens_cache=slot.n_prompt_tokens_cache,
                         next_token=[{"has_next_token": slot.is_processing, "has_new_line": False,
                                      "n_remain": -1, "n_decoded": slot.n_decoded}])
        result.append(entry)
    return result


METRIC_HELP = {
    "prompt_tokens_total": ("counter", "Number of prompt tokens processed."),
    "prompt_tokens_cached_total": ("counter", "Number of prompt tokens reused from the cache."),
    "prompt_seconds_total": ("counter", "Prompt process time"),
    "tokens_predicted_total": ("counter", "Number of generation tokens processed."),
    "tokens_predicted_seconds_total": ("counter", "Predict process time"),
    "n_decode_total": ("counter", "Total number of llama_decode() calls"),
    "n_tokens_max": ("counter", "Largest observed n_tokens."),
    "requests_processing": ("gauge", "Number of requests processing."),
    "requests_deferred": ("gauge", "Number of requests deferred."),
}


def metrics_text(stats: EngineStats) -> str:
    values: dict[str, float] = dict(stats.counters)
    values["requests_processing"] = stats.requests_processing
    values["requests_deferred"] = stats.requests_deferred
    lines = []
    for name, (kind, help_text) in METRIC_HELP.items():
        lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}",
                  f"llamacpp:{name} {values.get(name, 0)}"]
    lines += ["# HELP llamacpp:requests_deferred_by_key Requests waiting for a slot, by API key name.",
              "# TYPE llamacpp:requests_deferred_by_key gauge"]
    for client, count in sorted(stats.deferred_by_client.items()):
        label = client.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'llamacpp:requests_deferred_by_key{{key="{label}"}} {count}')
    return "\n".join(lines) + "\n"


def tokenize(body: TokenizeRequest, tokenizer: Tokenizer) -> dict[str, Any]:
    """/tokenize: text and token ids mixed; pieces as text, or bytes when not valid UTF-8."""
    if body.content is None:
        return {"tokens": []}
    parts = [body.content] if isinstance(body.content, str) else body.content
    tokens: list[int] = []
    for index, part in enumerate(parts):
        if isinstance(part, int):
            tokens.append(part)
        else:
            tokens += tokenizer.tokenize(part, add_special=body.add_special and index == 0,
                                         parse_special=body.parse_special)
    if not body.with_pieces:
        return {"tokens": tokens}
    pieces = []
    for token in tokens:
        raw = tokenizer.token_piece(token, special=True)
        try:
            piece: Any = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        pieces.append({"id": token, "piece": piece})
    return {"tokens": pieces}


def detokenize(body: DetokenizeRequest, tokenizer: Tokenizer) -> dict[str, str]:
    return {"content": tokenizer.detokenize([t for t in body.tokens if tokenizer.valid_token(t)], special=True)}
