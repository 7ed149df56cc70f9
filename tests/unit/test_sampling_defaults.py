"""The server's sampling flags become every request's defaults (kinetic.config.sampling_defaults), and the chat
layer lays a request's own fields over them, as llama-server's params_from_json does."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from kinetic.chat.prepare import ChatLayer, ServerDefaults
from kinetic.chat.templates import ChatTemplate, builtin_template
from kinetic.chat.types import SAMPLER_FIELDS, GenerationOptions, OutputConstraint, PromptRequest, SamplingOptions
from kinetic.config.args import parse_serve_args
from kinetic.config.sampling_defaults import (
    FROM_SETTING,
    NO_FLAG,
    SHAPED,
    default_sampling,
    default_stops,
    parse_logit_bias,
    process_escapes,
)
from kinetic.config.settings import ServerSettings, SettingsError
from kinetic.engine.types import DEFAULT_DRY_BREAKERS, DEFAULT_SAMPLERS, SamplingParams
from kinetic.protocols.common.translate import sampling_options
from kinetic.protocols.common.types import SamplingFields
from kinetic.protocols.ollama import types as ollama
from tests.scripted import ScriptedEngine

SCHEMA = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'


def settings(*argv: str) -> ServerSettings:
    return parse_serve_args(list(argv), environ={})


def test_without_flags_the_defaults_are_llama_servers() -> None:
    assert default_sampling(ServerSettings()) == SamplingParams()
    assert default_stops(ServerSettings()) == ()


def test_every_sampling_flag_reaches_the_defaults() -> None:
    s = settings("--temp", "0.3", "--top-k", "7", "--top-p", "0.5", "--min-p", "0.2", "--top-n-sigma", "1.5",
                 "--typical-p", "0.9", "--xtc-probability", "0.4", "--xtc-threshold", "0.3", "--repeat-last-n", "32",
                 "--repeat-penalty", "1.2", "--presence-penalty", "0.1", "--frequency-penalty", "0.2",
                 "--dry-multiplier", "0.8", "--dry-base", "2", "--dry-allowed-length", "3",
                 "--dry-penalty-last-n", "16", "--adaptive-target", "0.5", "--adaptive-decay", "0.5",
                 "--dynatemp-range", "0.2", "--dynatemp-exp", "1.5", "--mirostat", "2", "--mirostat-lr", "0.2",
                 "--mirostat-ent", "4", "-s", "3", "--ignore-eos", "-bs", "-l", "15+1", "-l", "16-2.5")
    p = default_sampling(s)
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.top_n_sigma, p.typical_p) == (0.3, 7, 0.5, 0.2, 1.5, 0.9)
    assert (p.xtc_probability, p.xtc_threshold, p.repeat_last_n, p.repeat_penalty) == (0.4, 0.3, 32, 1.2)
    assert (p.presence_penalty, p.frequency_penalty, p.dry_multiplier, p.dry_base) == (0.1, 0.2, 0.8, 2.0)
    assert (p.dry_allowed_length, p.dry_penalty_last_n, p.adaptive_target, p.adaptive_decay) == (3, 16, 0.5, 0.5)
    assert (p.dynatemp_range, p.dynatemp_exponent, p.mirostat, p.mirostat_eta, p.mirostat_tau) == (0.2, 1.5, 2, 0.2, 4)
    assert p.seed == 3 and p.ignore_eos and p.backend_sampling and p.logit_bias == {15: 1.0, 16: -2.5}


def test_variables_set_the_defaults_too() -> None:
    s = parse_serve_args([], environ={"LLAMA_ARG_TOP_K": "5", "LLAMA_ARG_MIN_P": "0", "KINETIC_TOP_P": "0.7"})
    p = default_sampling(s)
    assert (p.top_k, p.min_p, p.top_p) == (5, 0.0, 0.7)


def test_a_dry_base_below_one_keeps_the_default() -> None:
    assert settings("--dry-base", "0.5").dry_base == 1.75  # llama-server ignores it


def test_samplers_by_name_or_by_letter() -> None:
    assert default_sampling(settings("--samplers", "top_k;temperature")).samplers == ("top_k", "temperature")
    assert default_sampling(settings("--sampling-seq", "kt")).samplers == ("top_k", "temperature")
    assert default_sampling(settings("--samplers", "min_p;nonsense;temp")).samplers == ("min_p", "temperature")
    assert default_sampling(settings()).samplers == DEFAULT_SAMPLERS


def test_escapes_are_processed_unless_no_escape() -> None:
    assert process_escapes(r"a\nb\tc\\d\x7d\q") == "a\nb\tc\\d}\\q"
    assert default_stops(settings("-r", r"\n\n", "-r", "User:")) == ("\n\n", "User:")
    assert default_stops(settings("--no-escape", "-r", r"\n")) == (r"\n",)
    assert default_sampling(settings("--dry-sequence-breaker", r"\n")).dry_sequence_breakers == ("\n",)


def test_dry_breakers_replace_the_defaults_and_none_clears_them() -> None:
    assert default_sampling(settings()).dry_sequence_breakers == DEFAULT_DRY_BREAKERS
    assert default_sampling(settings("--dry-sequence-breaker", "x", "--dry-sequence-breaker", "y")) \
        .dry_sequence_breakers == ("x", "y")
    assert default_sampling(settings("--dry-sequence-breaker", "none")).dry_sequence_breakers == ()


def test_logit_bias_entries() -> None:
    assert parse_logit_bias(("15043+1", "15043-1", "7+inf", "8-inf")) == {15043: -1.0, 7: float("inf"),
                                                                          8: float("-inf")}
    with pytest.raises(SettingsError, match="for -l: '15043': expected TOKEN_ID"):
        settings("-l", "15043")


def test_grammar_and_json_schema_from_text_or_file(tmp_path: Path) -> None:
    grammar = 'root ::= "yes" | "no"'
    assert default_sampling(settings("--grammar", grammar)).grammar == grammar
    (tmp_path / "g.gbnf").write_text(grammar)
    assert default_sampling(settings("--grammar-file", str(tmp_path / "g.gbnf"))).grammar == grammar
    from_text = default_sampling(settings("--json-schema", SCHEMA)).grammar
    assert from_text and "root ::=" in from_text
    (tmp_path / "s.json").write_text(SCHEMA)
    assert default_sampling(settings("-jf", str(tmp_path / "s.json"))).grammar == from_text


@pytest.mark.parametrize(("argv", "message"), [
    (["--json-schema", "{nope"], "for --json-schema: not valid JSON"),
    (["--json-schema", "[1]"], "for --json-schema: expected a JSON schema object"),
    (["--json-schema-file", "/no/such.json"], "for --json-schema-file: no such file"),
    (["--grammar-file", "/no/such.gbnf"], "for --grammar-file: no such file"),
    (["--repeat-penalty", "0"], "for --repeat-penalty: must be > 0"),
    (["--mirostat", "3"], "for --mirostat: must be <= 2"),
])
def test_bad_sampling_flags_stop_the_start_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        settings(*argv)


# --- the merge: a request's own field wins, on top of the server's --------------------------------------


@pytest.fixture()
def layer() -> ChatLayer:
    engine = ScriptedEngine([])
    engine.loaded.set()
    engine.load()
    server = settings("--temp", "0", "--top-k", "1", "-s", "3", "-r", "X", "--ignore-eos", "-l", "15+2",
                      "--grammar", 'root ::= "a"+')
    defaults = ServerDefaults(sampling=default_sampling(server), stop=default_stops(server))
    return ChatLayer(engine, ChatTemplate(builtin_template("gemma"), "builtin:gemma"), defaults)


def prompt(layer: ChatLayer, options: SamplingOptions = SamplingOptions(),  # noqa: B008  frozen dataclass
           stop: tuple[str, ...] = (),
           output: OutputConstraint = OutputConstraint()):  # noqa: B008  frozen dataclass
    return layer.prepare_prompt(PromptRequest(prompt="hi", options=GenerationOptions(sampling=options, stop=stop),
                                              output=output))


def test_a_request_without_fields_gets_the_servers(layer: ChatLayer) -> None:
    request = prompt(layer)
    s = request.sampling
    assert (s.temperature, s.top_k, s.seed, s.ignore_eos, s.logit_bias) == (0.0, 1, 3, True, {15: 2.0})
    assert s.grammar == 'root ::= "a"+' and request.stop == ("X",)


def test_a_requests_own_fields_win(layer: ChatLayer) -> None:
    own = {"temperature": 0.5, "top_k": 9, "seed": 1, "ignore_eos": False}
    request = prompt(layer, SamplingOptions(own, logit_bias={}),
                     stop=("Y",), output=OutputConstraint(grammar='root ::= "b"'))
    s = request.sampling
    assert (s.temperature, s.top_k, s.seed, s.ignore_eos, s.logit_bias) == (0.5, 9, 1, False, {})
    assert s.grammar == 'root ::= "b"' and request.stop == ("Y",)
    # an empty grammar asks for nothing: the server's stays, as in llama-server
    assert prompt(layer, output=OutputConstraint(grammar="")).sampling.grammar == 'root ::= "a"+'


def test_translators_leave_unset_fields_to_the_server() -> None:
    """None is 'not sent' all the way down, so the server's default can apply on every protocol."""

    options = sampling_options(SamplingFields())
    assert options == SamplingOptions()
    assert options.get("ignore_eos") is None and options.logit_bias is None
    sent = sampling_options(SamplingFields(ignore_eos=False, logit_bias={}))
    assert sent.chosen == {"ignore_eos": False} and sent.logit_bias == {}
    # a sampler a protocol's model does not declare is read where the client sent it (models allow extras)
    assert sampling_options(ollama.Options.model_validate({"min_keep": 3, "temperature": 0.1})).chosen == {
        "min_keep": 3, "temperature": 0.1}


def test_every_sampler_is_one_declaration() -> None:
    """A SamplingParams field is a request field on llama-server's wire (the same name), its server default
    comes from the flag of its name or FLAG_FOR_FIELD's, and the chat layer lays it over the defaults: adding
    a sampler is its SamplingParams line and, for a protocol that spells it otherwise, that alias."""
    wire = set(SamplingFields.model_fields)
    assert SAMPLER_FIELDS <= wire, SAMPLER_FIELDS - wire
    assert set(FROM_SETTING.values()) <= set(ServerSettings.model_fields)
    assert set(FROM_SETTING) | SHAPED | NO_FLAG == {f.name for f in fields(SamplingParams)}
    one_each = {f.name: f.default for f in fields(SamplingParams) if f.name in SAMPLER_FIELDS and f.name != "samplers"
                and isinstance(f.default, (int, float))}
    changed = {name: (not value) if isinstance(value, bool) else value + 1 for name, value in one_each.items()}
    engine = ScriptedEngine([])
    engine.loaded.set()
    engine.load()
    layer = ChatLayer(engine, ChatTemplate(builtin_template("gemma"), "builtin:gemma"), ServerDefaults())
    laid = prompt(layer, SamplingOptions(changed)).sampling
    assert {name: vars(laid)[name] for name in changed} == changed


def test_props_shows_the_servers_defaults() -> None:
    from kinetic.engine.types import GenerationRequest
    from kinetic.protocols.common.native import generation_settings

    p = default_sampling(settings("--top-k", "3", "-bs", "--samplers", "top_k;temperature", "--json-schema", SCHEMA))
    shown = generation_settings(GenerationRequest(prompt_tokens=[], sampling=p), short=True)
    assert shown["top_k"] == 3 and shown["backend_sampling"] is True and shown["samplers"] == ["top_k", "temperature"]
    long = generation_settings(GenerationRequest(prompt_tokens=[], sampling=replace(p, logit_bias={5: -1.0}),
                                                 stop=("X",)))
    assert long["grammar"] == p.grammar and long["stop"] == ["X"] and long["logit_bias"] == [{"bias": -1.0,
                                                                                               "token": 5}]
    assert json.dumps(shown)  # JSON-serialisable as /props sends it
