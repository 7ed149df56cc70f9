"""The server's sampling flags as the defaults every request starts from (llama-server's params_base.sampling).

Pure: settings in, SamplingParams and stop strings out. The chat layer (kinetic.chat.prepare) lays a
request's own fields over these, whatever protocol it came in by, and /props shows them.
"""

from __future__ import annotations

from pathlib import Path

from kinetic.engine.types import DEFAULT_DRY_BREAKERS, DEFAULT_SAMPLERS, SamplingParams
from kinetic.protocols.common.translate import sampler_order
from kinetic.setting_values import LOGIT_BIAS_ENTRY, schema_grammar_or_error
from kinetic.settings import ServerSettings

_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}


def process_escapes(text: str) -> str:
    """llama.cpp's string_process_escapes: \\n \\r \\t \\' \\" \\\\ and \\xHH; any other backslash stays."""
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            code = text[index + 1]
            if code in _ESCAPES:
                out.append(_ESCAPES[code])
                index += 2
                continue
            digits = text[index + 2:index + 4]
            if code == "x" and len(digits) == 2 and all(c in "0123456789abcdefABCDEF" for c in digits):
                out.append(chr(int(digits, 16)))
                index += 4
                continue
            out.append("\\" + code)
            index += 2
            continue
        out.append(char)
        index += 1
    return "".join(out)


def parse_logit_bias(entries: tuple[str, ...]) -> dict[int, float]:
    """`--logit-bias 15043+1 --logit-bias 15043-1`: token id, sign, amount (the later entry for a token wins)."""
    bias: dict[int, float] = {}
    for entry in entries:
        match = LOGIT_BIAS_ENTRY.fullmatch(entry)
        if match is None:
            raise ValueError(f"--logit-bias {entry!r}: expected TOKEN_ID(+/-)BIAS")
        token, sign, amount = match.groups()
        bias[int(token)] = float(amount) * (-1.0 if sign == "-" else 1.0)
    return bias


def dry_breakers(values: tuple[str, ...], escape: bool) -> tuple[str, ...]:
    """Given breakers replace the defaults; `none` clears what came before it."""
    if not values:
        return DEFAULT_DRY_BREAKERS
    breakers: list[str] = []
    for value in values:
        if value == "none":
            breakers.clear()
        else:
            breakers.append(process_escapes(value) if escape else value)
    return tuple(breakers)


def default_grammar(settings: ServerSettings) -> str | None:
    """--grammar, --grammar-file, --json-schema or --json-schema-file as GBNF (the file wins over the text)."""
    if settings.json_schema_file is not None:
        return schema_grammar_or_error(Path(settings.json_schema_file).expanduser().read_text(encoding="utf-8"))
    if settings.json_schema is not None:
        return schema_grammar_or_error(settings.json_schema)
    if settings.grammar_file is not None:
        return Path(settings.grammar_file).expanduser().read_text(encoding="utf-8")
    return settings.grammar or None


def default_samplers(settings: ServerSettings) -> tuple[str, ...]:
    if settings.samplers is not None:
        return sampler_order([name for name in settings.samplers.split(";") if name]) or ()
    if settings.sampling_seq is not None:
        return sampler_order(settings.sampling_seq) or ()
    return DEFAULT_SAMPLERS


def default_sampling(settings: ServerSettings) -> SamplingParams:
    """What a request gets for every sampler field it leaves out."""
    return SamplingParams(
        temperature=max(settings.temp, 0.0), top_k=settings.top_k, top_p=settings.top_p, min_p=settings.min_p,
        typical_p=settings.typical_p, repeat_penalty=settings.repeat_penalty, repeat_last_n=settings.repeat_last_n,
        presence_penalty=settings.presence_penalty, frequency_penalty=settings.frequency_penalty,
        seed=settings.seed, logit_bias=parse_logit_bias(settings.logit_bias), grammar=default_grammar(settings),
        ignore_eos=settings.ignore_eos, dynatemp_range=settings.dynatemp_range,
        dynatemp_exponent=settings.dynatemp_exp, top_n_sigma=settings.top_n_sigma,
        xtc_probability=settings.xtc_probability, xtc_threshold=settings.xtc_threshold,
        dry_multiplier=settings.dry_multiplier, dry_base=settings.dry_base,
        dry_allowed_length=settings.dry_allowed_length, dry_penalty_last_n=settings.dry_penalty_last_n,
        dry_sequence_breakers=dry_breakers(settings.dry_sequence_breaker, settings.escape),
        mirostat=settings.mirostat, mirostat_tau=settings.mirostat_ent, mirostat_eta=settings.mirostat_lr,
        adaptive_target=settings.adaptive_target, adaptive_decay=settings.adaptive_decay,
        samplers=default_samplers(settings), backend_sampling=settings.backend_sampling,
    )


def default_stops(settings: ServerSettings) -> tuple[str, ...]:
    """-r/--reverse-prompt: the stop strings of a request that sends none."""
    return tuple(process_escapes(s) if settings.escape else s for s in settings.reverse_prompt if s)
