"""llama-server native JSON: /completion, /infill and /embedding requests inward, their results and
stream events outward. Pure: nothing here touches a backend. The server's state (/props, /slots,
/metrics) is shaped in `server_state`, /tokenize's answers in `tokens`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from kinetic.chat.types import (
    GenerationOptions,
    MediaPart,
    OutputConstraint,
    PreparedRequest,
    PromptInput,
    PromptRequest,
)
from kinetic.chat.types import InfillRequest as NeutralInfill
from kinetic.classroom.outcome import Outcome
from kinetic.engine.types import (
    Event,
    Finished,
    PromptProgress,
    TextDelta,
    TokenLogprob,
)
from kinetic.errors import InvalidRequestError, KineticError
from kinetic.protocols.common import media
from kinetic.protocols.common import translate as common
from kinetic.protocols.common.native import generation_settings, native_result
from kinetic.protocols.common.streaming import sse_data
from kinetic.protocols.common.translate import logprob_entry
from kinetic.protocols.common.types import SamplingFields
from kinetic.protocols.llamacpp.types import (
    CompletionRequest,
    EmbeddingRequest,
    InfillRequest,
)


def error_body(err: KineticError) -> dict[str, Any]:
    return {"error": {"code": err.status, "message": err.message, "type": err.kind, **err.extra}}


PROMPT_ELEMENTS = ('"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt '
                   'string, or a list of mixed strings & tokens.')


@dataclass
class NativeContext:
    model: str
    n_probs: int
    return_tokens: bool
    prompt_text: str
    generation_settings: dict[str, Any]
    index: int = 0
    n_prompt_tokens: int = 0
    post_sampling_probs: bool = False
    timings_per_token: bool = False
    outcome: Outcome = field(default_factory=Outcome)

    def __post_init__(self) -> None:
        self.outcome.model = self.model


PromptItem = tuple[PromptInput, tuple[MediaPart, ...]]  # a prompt and the files its media markers stand for


def prompt_items(prompt: Any) -> list[PromptItem]:
    """llama-server's prompt shapes: text, token ids, mixed ([12, "text", 34]) or {"prompt_string": text,
    "multimodal_data"?: [base64...]} are one prompt; a list holding no number at its top level is several
    prompts, each of those shapes. Whether the model reads the files is the chat layer's to say."""
    def is_piece(item: Any) -> bool:
        return isinstance(item, str) or (isinstance(item, int) and not isinstance(item, bool))

    def one(item: Any, param: str) -> PromptItem:
        if isinstance(item, str):
            return item, ()
        if isinstance(item, dict) and isinstance(item.get("prompt_string"), str):
            files = item.get("multimodal_data")
            return item["prompt_string"], () if files is None else media.multimodal_files(
                files, f"{param}.multimodal_data")
        if isinstance(item, list) and item and all(is_piece(x) for x in item):
            return list(item), ()
        raise InvalidRequestError(PROMPT_ELEMENTS, param="prompt")

    if isinstance(prompt, list):
        if not prompt:
            raise InvalidRequestError('"prompt" must not be empty', param="prompt")
        if any(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            return [one(prompt, "prompt")]
        return [one(item, "prompt" if len(prompt) == 1 else f"prompt[{i}]") for i, item in enumerate(prompt)]
    return [one(prompt, "prompt")]


def prompt_inputs(prompt: Any) -> list[PromptInput]:
    """The prompts of a route that reads no media (/embedding): a prompt object's files are refused."""
    items = prompt_items(prompt)
    if any(files for _, files in items):
        raise InvalidRequestError("multimodal_data is not supported here: embeddings are of text only",
                                  param="prompt")
    return [text for text, _ in items]


def _output(req: SamplingFields) -> OutputConstraint:
    # /completion takes the grammar when both are sent (chat routes refuse the pair)
    schema = req.json_schema if req.grammar is None else None
    return OutputConstraint(grammar=req.grammar, schema=schema,
                            param="json_schema" if schema is not None else "grammar")


def _options(req: CompletionRequest | InfillRequest, n_probs: int | None) -> GenerationOptions:
    if n_probs is not None and n_probs < 0:
        common.check_range("n_probs", n_probs, 0, 2147483647)
    max_tokens = common.max_tokens_from([("n_predict", req.n_predict),
                                         ("max_completion_tokens", req.max_completion_tokens),
                                         ("max_tokens", req.max_tokens)], minimum=-1)
    options = common.generation_options(req, max_tokens=max_tokens, n_probs=n_probs or 0)
    return replace(options, return_progress=bool(req.stream and req.return_progress))


def to_prompt_requests(req: CompletionRequest, *, n_slots: int = 1) -> list[PromptRequest]:
    """One request per prompt, each `n_cmpl` times (llama-server's order: a prompt, then its copies).
    As llama-server does, `n_cmpl` (alias `n`) runs its copies at once, so it may not exceed the slot
    count; a copy with an explicit seed samples with seed + 1, + 2... so that copies differ."""
    n_probs = req.n_probs
    if n_probs is None and isinstance(req.logprobs, int) and not isinstance(req.logprobs, bool):
        n_probs = req.logprobs  # the alias
    n_cmpl, field = (req.n_cmpl, "n_cmpl") if req.n_cmpl is not None else (req.n, "n")
    if n_cmpl is not None:
        common.check_range(field, n_cmpl, 1, n_slots)
    options = _options(req, n_probs)
    output = _output(req)
    prompts = prompt_items(req.prompt)
    requests = []
    for i, (prompt, files) in enumerate(prompts):
        param = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        for copy in range(n_cmpl or 1):
            seed = options.sampling.get("seed")
            copy_options = options if not copy or seed is None or seed == -1 else replace(
                options, sampling=options.sampling.with_values(seed=(seed + copy) % 2**32))
            requests.append(PromptRequest(prompt=prompt, options=copy_options, output=output, param=param,
                                          media=files))
    return requests


def to_infill_request(req: InfillRequest) -> NeutralInfill:
    """llama-server's /infill checks, in its order and words."""
    if req.prompt is not None and not isinstance(req.prompt, str):
        raise InvalidRequestError('"prompt" must be a string', param="prompt")
    for name in ("input_prefix", "input_suffix"):
        if not isinstance(getattr(req, name), str):
            raise InvalidRequestError(f'"{name}" is required', param=name)
    extra = req.input_extra if req.input_extra is not None else []
    if not isinstance(extra, list):
        raise InvalidRequestError('"input_extra" must be an array of {"filename": string, "text": string}',
                                  param="input_extra")
    chunks = []
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise InvalidRequestError('extra_context chunk must contain a "text" field with a string value',
                                      param="input_extra")
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise InvalidRequestError('extra_context chunk\'s "filename" field must be a string', param="input_extra")
        chunks.append((chunk.get("filename", "tmp"), chunk["text"]))
    return NeutralInfill(prefix=req.input_prefix, suffix=req.input_suffix, extra=tuple(chunks),
                         prompt=req.prompt or "", options=_options(req, req.n_probs), output=_output(req))


def native_context(req: CompletionRequest | InfillRequest, generation: PreparedRequest, *, model: str,
                   prompt_text: str, index: int = 0, speculative: tuple[str, ...] = ()) -> NativeContext:
    timings_per_token = bool(req.timings_per_token)
    return NativeContext(model=model, n_probs=generation.n_probs, return_tokens=bool(req.return_tokens),
                         prompt_text=prompt_text, index=index, n_prompt_tokens=generation.n_prompt_tokens,
                         post_sampling_probs=generation.post_sampling_probs, timings_per_token=timings_per_token,
                         generation_settings=generation_settings(generation, stream=bool(req.stream),
                                                                 timings_per_token=timings_per_token,
                                                                 speculative=speculative))


def probs_entry(logprob: TokenLogprob, ctx: NativeContext) -> dict[str, Any]:
    """One token's probabilities: log-probabilities before sampling, or with `post_sampling_probs`
    the sampler chain's probabilities (`prob`, `top_probs`)."""
    if not ctx.post_sampling_probs:
        return logprob_entry(logprob, ctx.n_probs)
    return {"id": logprob.id, "token": logprob.token, "bytes": logprob.bytes, "prob": math.exp(logprob.logprob),
            "top_probs": [{"id": alt.id, "token": alt.token, "bytes": alt.bytes, "prob": math.exp(alt.logprob)}
                          for alt in logprob.top_logprobs[:ctx.n_probs]]}


def _final(finished: Finished, ctx: NativeContext, *, content: str, tokens: list[int]) -> dict[str, Any]:
    return native_result(finished, model=ctx.model, prompt=ctx.prompt_text, settings=ctx.generation_settings,
                         content=content, tokens=tokens, index=ctx.index)


def to_completion(deltas: list[TextDelta], finished: Finished, ctx: NativeContext) -> dict[str, Any]:
    body = _final(finished, ctx, content=finished.text, tokens=finished.tokens if ctx.return_tokens else [])
    ctx.outcome.finished(finished, finished.stop_type, answer=finished.text)
    if ctx.n_probs:
        body["completion_probabilities"] = [probs_entry(d.logprob, ctx) for d in deltas if d.logprob]
    return body


class NativeEncoder:
    """/completion stream: one `data:` event per token, a final event with everything; no [DONE]."""

    def __init__(self, ctx: NativeContext):
        self.ctx = ctx
        self.n_predicted = 0

    @property
    def outcome(self) -> Outcome:
        return self.ctx.outcome

    def _partial(self, content: str, tokens: list[int]) -> dict[str, Any]:
        return {"index": self.ctx.index, "content": content, "tokens": tokens, "stop": False, "id_slot": -1,
                "tokens_predicted": self.n_predicted, "tokens_evaluated": self.ctx.n_prompt_tokens}

    def encode(self, event: Event) -> list[bytes]:
        if isinstance(event, Finished):
            self.outcome.finished(event, event.stop_type)
            return [sse_data(_final(event, self.ctx, content="", tokens=[]))]
        if isinstance(event, PromptProgress):
            chunk = self._partial("", [])
            chunk["prompt_progress"] = event.to_dict()
            if self.ctx.timings_per_token:
                chunk["timings"] = event.timings().to_dict()
            return [sse_data(chunk)]
        self.n_predicted += 1
        self.outcome.chunk(event.text)
        chunk = self._partial(event.text, [event.token_id])
        if self.ctx.timings_per_token and event.timings is not None:
            chunk["timings"] = event.timings.to_dict()
        if event.logprob is not None and self.ctx.n_probs:
            chunk["completion_probabilities"] = [probs_entry(event.logprob, self.ctx)]
        return [sse_data(chunk)]

    def error(self, err: KineticError) -> list[bytes]:
        """llama-server ends a failed stream with one error event and no terminator of its own."""
        return [sse_data(error_body(err))]


# ------------------------------------------------------------------------------- embeddings


def embedding_inputs(req: EmbeddingRequest) -> tuple[list[PromptInput], list[str]]:
    """/embedding's inputs: `input`, else `content`; one prompt or several, as /completion reads them."""
    field_name = "input" if req.input is not None else "content"
    raw = req.input if req.input is not None else req.content
    if raw is None:
        raise InvalidRequestError('"input" or "content" must be provided', param="input")
    if isinstance(raw, list) and not raw:
        raise InvalidRequestError(f'"{field_name}" must not be empty', param=field_name)
    try:
        items = prompt_inputs(raw)
    except InvalidRequestError as exc:
        raise InvalidRequestError(exc.message.replace('"prompt"', f'"{field_name}"'), param=field_name) from exc
    return items, [field_name] if len(items) == 1 else [f"{field_name}[{i}]" for i in range(len(items))]


def normalize(vector: list[float], mode: int) -> list[float]:
    """llama.cpp's common_embd_normalize: -1 none, 0 max-abs scaled to int16, 1 taxicab, 2 L2, >2 p-norm."""
    if mode < 0:
        return vector
    if mode == 0:
        total = max((abs(v) for v in vector), default=0.0) / 32760.0
    elif mode == 1:
        total = sum(abs(v) for v in vector)
    elif mode == 2:
        total = math.sqrt(sum(v * v for v in vector))
    else:
        total = sum(abs(v) ** mode for v in vector) ** (1.0 / mode)
    scale = 1.0 / total if total > 0 else 0.0
    return [v * scale for v in vector]


def to_native_embeddings(vectors: list[list[list[float]]], *, pooling: str,
                         embd_normalize: int) -> list[dict[str, Any]]:
    """`[{index, embedding: [[...]]}]`: one pooled vector normalised per `embd_normalize`, or with
    pooling none one raw vector per token."""
    return [{"index": index, "embedding": rows if pooling == "none" else [normalize(rows[0], embd_normalize)]}
            for index, rows in enumerate(vectors)]
