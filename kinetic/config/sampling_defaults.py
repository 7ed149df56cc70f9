"""The server's sampling flags as the defaults every request starts from (llama-server's params_base.sampling).

Pure: settings in, SamplingParams and stop strings out. The chat layer (kinetic.chat.prepare) lays a
request's own fields over these, whatever protocol it came in by, and /props shows them.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from kinetic.config.settings import ServerSettings
from kinetic.config.values import LOGIT_BIAS_ENTRY, schema_grammar_or_error
from kinetic.engine.types import DEFAULT_DRY_BREAKERS, DEFAULT_SAMPLERS, SamplingParams, sampler_order

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


def breakers_from_flags(values: tuple[str, ...], escape: bool) -> tuple[str, ...]:
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


# The setting (a flag's dest) of each sampler field that its flag names otherwise (llama-server's spellings);
# every other field is set by the flag of its own name, but these, which the server's flags shape first
FLAG_FOR_FIELD = {"temperature": "temp", "dynatemp_exponent": "dynatemp_exp", "mirostat_tau": "mirostat_ent",
                  "mirostat_eta": "mirostat_lr"}
SHAPED = frozenset(("temperature", "logit_bias", "grammar", "dry_sequence_breakers", "samplers"))
NO_FLAG = frozenset(("min_keep",))  # llama-server has no flag for it either: a request's own or the default
# each sampler field set straight from a setting, and that setting's name
FROM_SETTING = {f.name: FLAG_FOR_FIELD.get(f.name, f.name) for f in fields(SamplingParams)
                if f.name not in SHAPED | NO_FLAG}


def default_sampling(settings: ServerSettings) -> SamplingParams:
    """What a request gets for every sampler field it leaves out."""
    flags = settings.model_dump()
    given = {name: flags[setting] for name, setting in FROM_SETTING.items()}
    return SamplingParams(
        **given, temperature=max(settings.temp, 0.0), logit_bias=parse_logit_bias(settings.logit_bias),
        grammar=default_grammar(settings),
        dry_sequence_breakers=breakers_from_flags(settings.dry_sequence_breaker, settings.escape),
        samplers=default_samplers(settings))


def default_stops(settings: ServerSettings) -> tuple[str, ...]:
    """-r/--reverse-prompt: the stop strings of a request that sends none."""
    return tuple(process_escapes(s) if settings.escape else s for s in settings.reverse_prompt if s)
