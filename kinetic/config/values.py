"""The kinds of value a server setting takes, each checked where it is declared on ServerSettings.

A check raises ValueError with the reason; kinetic.config.args puts the flag or variable in front of it.
Files and folders a flag names are checked now, so a typo stops the start before the model loads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from kinetic.engine.options import parse_cpu_mask, parse_cpu_range, parse_kv_override, parse_spec_types

# llama.cpp's is_truthy / is_falsey spellings (common/arg.cpp), plus yes/no that kinetic always took.
TRUE_WORDS = frozenset({"on", "enabled", "true", "1", "yes"})
FALSE_WORDS = frozenset({"off", "disabled", "false", "0", "no"})
SWITCH_TYPES: tuple[object, ...] = (bool, bool | None)  # a switch that may also be left unset (None: kinetic decides)
LOGIT_BIAS_ENTRY = re.compile(r"\s*(-?\d+)\s*([+-])\s*(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+|inf)\s*",
                              re.IGNORECASE)
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?\s*", re.IGNORECASE)


def switch_word(value: str) -> bool:
    """A switch's value read from a variable: llama.cpp's words (enabled/disabled too)."""
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError("expected on/off, true/false, 1/0 or enabled/disabled")


def on_off_auto(value: Any) -> Any:
    """llama.cpp's is_truthy / is_falsey / is_autoy spellings (common/arg.cpp) -> on, off, auto."""
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return "on"
        if word in FALSE_WORDS:
            return "off"
        if word in ("auto", "-1"):
            return "auto"
    return value


def byte_size(value: Any) -> Any:
    """'4M', '512K', '64KiB', '65536' -> bytes (binary units: K = 1024); other values pass through."""
    if not isinstance(value, str):
        return value
    match = _SIZE.fullmatch(value)
    if match is None:
        raise ValueError(f"not a size: {value!r} (write bytes, or e.g. 512K, 4M)")
    number, unit = match.groups()
    return int(float(number) * 1024 ** " kmg".index(unit.lower() or " "))


def read_text(path: str) -> str:
    """A file a flag names, read now so a typo stops the start naming the flag."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError("no such file" if not file.exists() else "not a file")
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read it ({exc})") from None


def json_object_text(text: str, *, example: str = "") -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(parsed, dict):
        raise ValueError("expected a JSON object" + (f", like {example}" if example else ""))
    return parsed


def schema_grammar_or_error(text: str) -> str:
    """The GBNF of a JSON schema given as text; ValueError saying why not."""
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(schema, dict):
        raise ValueError('expected a JSON schema object, like \'{"type": "object"}\'')
    from kinetic.engine.grammar import grammar_from_json_schema

    return grammar_from_json_schema(schema)


def _existing_file(value: str) -> str:
    if not Path(value).expanduser().is_file():
        raise ValueError("no such file" if not Path(value).expanduser().exists() else "not a file")
    return value


def _existing_folder(value: str) -> str:
    if not Path(value).expanduser().is_dir():
        raise ValueError("no such folder" if not Path(value).expanduser().exists() else "not a folder")
    return value


def _in_existing_folder(value: str) -> str:
    if not Path(value).expanduser().parent.is_dir():
        raise ValueError("its folder does not exist")
    return value


def _checked(check: Any) -> AfterValidator:
    """A validator that runs `check` on the value and keeps the value as it was given."""
    def validate(value: Any) -> Any:
        check(value)
        return value
    return AfterValidator(validate)


def _one_from_a_variable(value: Any) -> Any:
    return (value,) if isinstance(value, str) else value  # a flag repeats; a variable holds one value


def _logit_bias_entries(value: tuple[str, ...]) -> tuple[str, ...]:
    for entry in value:
        if LOGIT_BIAS_ENTRY.fullmatch(entry) is None:
            raise ValueError(f"{entry!r}: expected TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-1")
    return value


def _kv_overrides(value: tuple[str, ...]) -> tuple[str, ...]:
    for item in value:
        for part in item.split(","):
            parse_kv_override(part)
    return value


def _lora_files(value: tuple[str, ...], *, scaled: bool) -> tuple[str, ...]:
    for item in value:
        for part in item.split(","):
            path = part.rpartition(":")[0] if scaled else part
            if scaled:
                try:
                    float(part.rpartition(":")[2])
                except ValueError:
                    raise ValueError(f"{part!r}: expected FNAME:SCALE, e.g. adapter.gguf:0.5") from None
            if not path or not Path(path).expanduser().is_file():
                raise ValueError(f"{path or part!r}: no such file")
    return value


def _upstream_list(value: Any) -> Any:
    # one flag per upstream on the command line; several in one variable, separated by spaces
    return tuple(value.split()) if isinstance(value, str) else value


def _upstream_specs(value: tuple[str, ...]) -> tuple[str, ...]:
    for spec in value:
        name, sep, rest = spec.partition("=")
        url = rest.split(",", 1)[0]
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise ValueError(f"{spec!r}: expected NAME=URL[,key=KEY] with an http(s) URL")
    return value


def _gpu_layers(value: str) -> str:
    word = value.strip().lower()
    if word not in ("auto", "all"):
        try:
            int(word)
        except ValueError:
            raise ValueError("expected a number of layers, auto or all") from None
    return word


def _tensor_split(value: str) -> str:
    parts = [p for p in re.split(r"[,/]+", value) if p.strip()]
    try:
        [float(p) for p in parts]
    except ValueError:
        raise ValueError("expected proportions separated by commas, e.g. 3,1") from None
    if len(parts) >= 16:
        raise ValueError(f"got {len(parts)} proportions, but llama.cpp takes at most 15")
    return value


def _device_list(value: str) -> str:
    from kinetic.engine.llama import devices  # llama.cpp's libraries load only when the flag is given

    devices.parse_device_list(value)
    return value


def _projector_device(value: str) -> str:
    """-mmdev: `none` (no offload) or one device this machine has, checked as -dev's are."""
    if value.strip() == "none":
        return "none"
    from kinetic.engine.llama import devices  # llama.cpp's libraries load only when the flag is given

    if len(devices.parse_device_list(value)) != 1:
        raise ValueError("only one device may be specified for mmproj")
    return value.strip()


def _download_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// URL")
    return value


def _tensor_overrides(value: tuple[str, ...]) -> tuple[str, ...]:
    from kinetic.engine.llama import devices

    for item in value:
        devices.parse_tensor_overrides(item)
    return value


def _hf_repo(value: str) -> str:
    repo = value.partition(":")[0]
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ValueError("expected <user>/<model>[:quant]")
    return value


def _auto_or_positive(message: str) -> AfterValidator:
    """-1 (auto, or off) or a number from 1: a count where 0 means nothing sensible."""
    def check(value: int) -> None:
        if value == 0 or value < -1:
            raise ValueError(message)
    return _checked(check)


def _layer_range(value: str) -> str:
    try:
        int(value.split()[0]), int(value.split()[1])
    except (ValueError, IndexError):
        raise ValueError("expected two layer numbers, START END") from None
    return value


def _template_name_or_jinja(value: str) -> str:
    from kinetic.chat.templates import BUILTIN_NAMES, known_names

    if value in BUILTIN_NAMES or "{%" in value or "{{" in value:
        return value
    if value not in known_names():
        raise ValueError(f"expected a built-in template name ({', '.join(known_names())}) or Jinja text")
    return value


Port = Annotated[int, Field(ge=0, le=65535)]
ByteSize = Annotated[int, BeforeValidator(byte_size), Field(ge=1)]
OnOffAuto = Annotated[Literal["on", "off", "auto"], BeforeValidator(on_off_auto)]
ExistingFile = Annotated[str, AfterValidator(_existing_file)]
ExistingFolder = Annotated[str, AfterValidator(_existing_folder)]
FileInExistingFolder = Annotated[str, AfterValidator(_in_existing_folder)]
ReadableFile = Annotated[str, _checked(read_text)]
JsonObjectText = Annotated[str, _checked(json_object_text)]
JsonObjectFile = Annotated[str, _checked(lambda path: json_object_text(read_text(path)))]
JsonSchemaText = Annotated[str, _checked(schema_grammar_or_error)]
JsonSchemaFile = Annotated[str, _checked(lambda path: schema_grammar_or_error(read_text(path)))]
Repeated = Annotated[tuple[str, ...], BeforeValidator(_one_from_a_variable)]  # a flag given any number of times
LogitBiases = Annotated[Repeated, AfterValidator(_logit_bias_entries)]
KvOverrides = Annotated[Repeated, AfterValidator(_kv_overrides)]
LoraFiles = Annotated[Repeated, AfterValidator(lambda value: _lora_files(value, scaled=False))]
ScaledLoraFiles = Annotated[Repeated, AfterValidator(lambda value: _lora_files(value, scaled=True))]
Upstreams = Annotated[tuple[str, ...], BeforeValidator(_upstream_list), AfterValidator(_upstream_specs)]
DeviceList = Annotated[str, AfterValidator(_device_list)]
ProjectorDevice = Annotated[str, AfterValidator(_projector_device)]
DownloadUrl = Annotated[str, AfterValidator(_download_url)]
TensorOverrides = Annotated[Repeated, AfterValidator(_tensor_overrides)]
GpuLayers = Annotated[str, AfterValidator(_gpu_layers)]
TensorSplit = Annotated[str, AfterValidator(_tensor_split)]
HfRepo = Annotated[str, AfterValidator(_hf_repo)]
SpecTypes = Annotated[str, _checked(parse_spec_types)]  # a ValueError names the unknown type
CpuMask = Annotated[str, _checked(parse_cpu_mask)]
CpuRange = Annotated[str, _checked(parse_cpu_range)]
SlotCount = Annotated[int, _auto_or_positive("expected -1 (auto) or a number of slots >= 1")]
IdleSeconds = Annotated[int, _auto_or_positive("cannot be 0 or less than -1")]  # llama-server's words
TemplateVariables = Annotated[str, _checked(lambda value: json_object_text(
    value, example="'{\"enable_thinking\": false}'"))]
TemplateName = Annotated[str, AfterValidator(_template_name_or_jinja)]
LayerRange = Annotated[str, AfterValidator(_layer_range)]
DryBase = Annotated[float, AfterValidator(lambda value: value if value >= 1.0 else 1.75)]  # llama-server's rule
