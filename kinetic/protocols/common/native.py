"""llama-server's native result objects, which more than one protocol shows: the /completion result,
and the same object as `__verbose` in OpenAI-shaped answers when the request (or --verbose) asks.
Pure."""

from __future__ import annotations

import math
from typing import Any

from kinetic.chat.types import PreparedRequest
from kinetic.engine.types import Finished

# generation_settings keys the short form (/props, /slots) leaves out
LONG_ONLY = ("dry_sequence_breakers", "stop", "logit_bias", "grammar", "grammar_lazy", "grammar_triggers",
             "preserved_tokens")


def generation_settings(request: PreparedRequest, *, stream: bool = False, timings_per_token: bool = False,
                        short: bool = False, speculative: tuple[str, ...] = ()) -> dict[str, Any]:
    """llama-server's task_params::to_json: the long form in /completion results, the short one
    (`short`) in /props and /slots; `speculative` is the kinds the server's slots draft with."""
    s = request.sampling
    settings: dict[str, Any] = {
        "seed": s.seed if s.seed >= 0 else 4294967295, "temperature": s.temperature,
        "dynatemp_range": s.dynatemp_range, "dynatemp_exponent": s.dynatemp_exponent, "top_k": s.top_k,
        "top_p": s.top_p, "min_p": s.min_p, "top_n_sigma": s.top_n_sigma, "xtc_probability": s.xtc_probability,
        "xtc_threshold": s.xtc_threshold, "typical_p": s.typical_p, "repeat_last_n": s.repeat_last_n,
        "repeat_penalty": s.repeat_penalty, "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty, "dry_multiplier": s.dry_multiplier, "dry_base": s.dry_base,
        "dry_allowed_length": s.dry_allowed_length, "dry_penalty_last_n": s.dry_penalty_last_n,
        "dry_sequence_breakers": list(s.dry_sequence_breakers), "mirostat": s.mirostat,
        "mirostat_tau": s.mirostat_tau, "mirostat_eta": s.mirostat_eta, "adaptive_target": s.adaptive_target,
        "adaptive_decay": s.adaptive_decay, "stop": list(request.stop), "max_tokens": request.max_tokens,
        "n_predict": request.max_tokens, "n_keep": request.n_keep, "n_discard": request.n_discard,
        "ignore_eos": s.ignore_eos,
        # JSON has no -inf: a banned token's bias is null, as llama-server's JSON library writes it
        "stream": stream, "logit_bias": [{"bias": b if math.isfinite(b) else None, "token": t}
                                         for t, b in s.logit_bias.items()],
        "n_probs": request.n_probs, "min_keep": s.min_keep, "grammar": s.grammar or "", "grammar_lazy": False,
        "grammar_triggers": [], "preserved_tokens": [], "chat_format": "Content-only", "reasoning_format": "none",
        "reasoning_in_content": False, "generation_prompt": "", "samplers": list(s.samplers),
        "speculative.types": ",".join(speculative) or "none", "timings_per_token": timings_per_token,
        "post_sampling_probs": request.post_sampling_probs, "backend_sampling": s.backend_sampling,
        "lora": [{"id": index, "scale": scale} for index, scale in request.lora or ()],
    }
    if short:
        for key in LONG_ONLY:
            settings.pop(key)
    return settings


def native_result(finished: Finished, *, model: str, prompt: str, settings: dict[str, Any], content: str,
                  tokens: list[int], index: int = 0) -> dict[str, Any]:
    """llama-server's final result (server_task_result_cmpl_final::to_json_non_oaicompat)."""
    return {
        "index": index, "content": content, "tokens": tokens, "id_slot": finished.id_slot, "stop": True,
        "model": model, "tokens_predicted": finished.usage.completion_tokens,
        "tokens_evaluated": finished.usage.prompt_tokens, "generation_settings": settings,
        "prompt": prompt, "has_new_line": "\n" in finished.text, "truncated": finished.truncated,
        "stop_type": finished.stop_type, "stopping_word": finished.stopping_word,
        "tokens_cached": finished.tokens_cached, "timings": finished.timings.to_dict(),
    }
