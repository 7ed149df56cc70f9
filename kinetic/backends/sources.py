"""Which models a router serves: repeated -m/-a, --models-dir, --models-preset, --upstream, and the
models of the Hugging Face cache (hub_cache.py) beside a --models-dir or a preset or with no model named.

Every source yields `ModelSpec`s; `model_specs()` merges them and refuses two models under one name.
The preset file is llama-server's INI format: one `[name]` section a model, keys spelled as the
long flags without their dashes (`model`, `hf`, `ctx-size`, `alias`...) or as LLAMA_ARG_* variables,
a `[*]` section of defaults for every model, `load-on-startup = true`; kinetic adds `upstream`.
A cached model whose file a preset section serves too is listed once, under the section's name, when
`dedup-cache-models` is set (in the section or in `[*]`); it still answers by its cache name.
Each model has its own projector: a section's `mmproj` (a path relative to the preset, as `model` is)
and the other projector keys, or in --models-dir the `mmproj` GGUF in a model's own sub-folder.
"""

from __future__ import annotations

import configparser
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kinetic.backends.bundled import BUNDLED, DEFAULT_ALIAS, default_model
from kinetic.backends.gguf_files import MMPROJ_KEYWORD, SHARD_PATTERN, best_mmproj, model_file
from kinetic.backends.hub_cache import cached_models, resolve_cached
from kinetic.config.flags import FLAGS, FLAGS_BY_SPELLING
from kinetic.config.settings import TRUE_WORDS, ServerSettings
from kinetic.errors import ModelLoadError

# Preset keys that say what the model is rather than how to run it.
PATH_KEYS = frozenset({"model", "m"})
HF_KEYS = frozenset({"hf", "hf-repo", "hfr"})
ALIAS_KEYS = frozenset({"alias", "a"})
UPSTREAM_KEYS = frozenset({"upstream"})
STARTUP_KEYS = frozenset({"load-on-startup"})
DEDUP_KEYS = frozenset({"dedup-cache-models"})
# llama-server's draft model from the hub: kinetic does not load it, but dedup-cache-models hides its cache entry
DRAFT_HF_KEYS = frozenset({"spec-draft-hf", "hfd", "hfrd", "hf-repo-draft", "llama-arg-spec-draft-hf-repo"})
# Per-model settings a preset may change; the rest (host, port, keys, ledger...) belong to the server.
PER_MODEL = frozenset({"ctx_size", "parallel", "batch_size", "ubatch_size", "threads", "n_predict", "temp", "seed",
                       "chat_template", "chat_template_file", "chat_template_kwargs", "jinja", "reasoning_format",
                       "embeddings", "hf_file", "fair_share", "max_in_flight", "max_queue", "mmproj", "mmproj_url",
                       "mmproj_auto", "mmproj_offload", "mmproj_device", "image_min_tokens", "image_max_tokens"})
# Per-model settings that name a file: read relative to the preset's folder, as its `model` is.
PRESET_PATHS = frozenset({"mmproj"})
HF_PREFIX = "hf:"  # kinetic.cli's mark for a -hf entry of ServerSettings.model_args
ENV_TO_FLAG = {env.lower(): flag for flag in FLAGS for env in flag.env_names}


@dataclass(frozen=True)
class UpstreamSpec:
    """One OpenAI-compatible server: its base URL (…/v1) and the key to send it."""

    url: str
    key: str | None = None
    model: str | None = None  # the id the upstream knows the model by (default: kinetic's name)

    @classmethod
    def parse(cls, value: str) -> UpstreamSpec:
        """`URL[,key=KEY][,model=ID]`."""
        url, *options = [part.strip() for part in value.split(",")]
        found: dict[str, str] = {}
        for option in options:
            name, _, setting = option.partition("=")
            if name not in ("key", "model"):
                raise ModelLoadError(f"upstream {value!r}: unknown option {name!r} (expected key=KEY or model=ID)")
            found[name] = setting
        url = url.rstrip("/")
        return cls(url=url if url.endswith("/v1") else url + "/v1", key=found.get("key"), model=found.get("model"))


@dataclass(frozen=True)
class ModelSpec:
    """A model the router answers for, loaded or not."""

    name: str
    aliases: tuple[str, ...] = ()
    path: Path | None = None
    hf_repo: str | None = None
    upstreams: tuple[UpstreamSpec, ...] = ()
    settings: ServerSettings | None = None  # the server's settings with this model's own values applied
    mmproj: Path | None = None  # the projector found beside the model (-hf's, a --models-dir sub-folder's)
    load_on_startup: bool = False
    source: str = "cli"  # cli, models-dir, preset, upstream, cache, bundled
    # dedup-cache-models: the cached files this preset model stands for (their cache entries are not listed)
    dedups: tuple[Path, ...] = ()
    hidden: bool = False  # a cache entry a preset stands for: served by name, not listed

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *(a for a in self.aliases if a != self.name))

    @property
    def remote(self) -> bool:
        return bool(self.upstreams)


def split_aliases(value: str | None) -> tuple[str, ...]:
    return tuple(a.strip() for a in (value or "").split(",") if a.strip())


def gguf_stem(path: Path) -> str:
    """`qwen-00001-of-00003.gguf` -> `qwen`; `bge-small.gguf` -> `bge-small`."""
    match = SHARD_PATTERN.search(path.name)
    return path.name[: match.start()] if match else path.stem


def from_model_args(settings: ServerSettings) -> list[ModelSpec]:
    specs = []
    for source, alias in settings.model_args:
        aliases = split_aliases(alias)
        if source.startswith(HF_PREFIX):  # -hf REPO[:QUANT]
            repo = source[len(HF_PREFIX):]
            specs.append(ModelSpec(name=aliases[0] if aliases else repo, aliases=aliases, hf_repo=repo))
            continue
        path, _ = model_file(source)
        specs.append(ModelSpec(name=aliases[0] if aliases else gguf_stem(path), aliases=aliases, path=path,
                               source="cli"))
    if not specs and (settings.model or settings.hf_repo):  # one model named the usual way, beside others
        aliases = split_aliases(settings.alias)
        if settings.model:
            path, _ = model_file(settings.model)
            specs.append(ModelSpec(name=aliases[0] if aliases else gguf_stem(path), aliases=aliases, path=path))
        else:
            assert settings.hf_repo is not None
            name = aliases[0] if aliases else settings.hf_repo
            specs.append(ModelSpec(name=name, aliases=aliases, hf_repo=settings.hf_repo))
    return specs


def from_models_dir(folder: Path) -> list[ModelSpec]:
    """Every GGUF under `folder` (first shard of a split model; projector files skipped). A model in a
    sub-folder gets that folder's projector (llama-server's load_from_models_dir; of several, best_mmproj's
    choice); one at the top of `folder` gets none, since the projector beside it may be another model's."""
    folder = folder.expanduser()
    specs = []
    for path in sorted(folder.rglob("*.gguf")):
        match = SHARD_PATTERN.search(path.name)
        if MMPROJ_KEYWORD in path.name.lower() or (match and match.group(1) != "00001"):
            continue
        projector = None
        if path.parent != folder:
            beside = sorted(p.name for p in path.parent.glob("*.gguf") if MMPROJ_KEYWORD in p.name)
            chosen = best_mmproj(beside, path.name)
            projector = path.parent / chosen if chosen else None
        specs.append(ModelSpec(name=gguf_stem(path), path=path, source="models-dir", mmproj=projector))
    return specs


def from_upstream_flags(values: tuple[str, ...]) -> list[ModelSpec]:
    """`NAME=URL[,key=KEY]` flags; the same NAME several times is one load-balanced pool."""
    pools: dict[str, list[UpstreamSpec]] = {}
    for value in values:
        name, _, rest = value.partition("=")
        pools.setdefault(name.strip(), []).append(UpstreamSpec.parse(rest))
    return [ModelSpec(name=name, upstreams=tuple(pool), source="upstream") for name, pool in pools.items()]


def _preset_key(key: str) -> str:
    """`--ctx-size`, `ctx_size`, `LLAMA_ARG_CTX_SIZE` -> `ctx-size` (a flag's long spelling)."""
    key = key.strip().lower().lstrip("-").replace("_", "-")
    flag = ENV_TO_FLAG.get(key.replace("-", "_"))
    if flag is not None:
        return next(n for n in flag.names if n.startswith("--")).lstrip("-")
    return key


def read_preset(path: Path, base: ServerSettings) -> tuple[list[ModelSpec], list[str]]:
    """The models of an INI preset, and the keys it sets that kinetic does not implement (warned about)."""
    parser = configparser.ConfigParser(interpolation=None, default_section="*", strict=False)
    try:
        text = path.expanduser().read_text(encoding="utf-8")
        # Keys before the first section (`version = 1`) belong to no model.
        parser.read_string("[__top__]\n" + text, source=str(path))
    except OSError as exc:
        raise ModelLoadError(f"cannot read the preset {path}: {exc.strerror}") from None
    except configparser.Error as exc:
        raise ModelLoadError(f"the preset {path} is not valid INI: {exc}".splitlines()[0]) from None
    specs: list[ModelSpec] = []
    ignored: list[str] = []
    for section in parser.sections():
        if section == "__top__":
            continue
        spec_path: Path | None = None
        hf_repo = None
        aliases: tuple[str, ...] = ()
        upstreams: list[UpstreamSpec] = []
        startup = False
        dedup = False
        draft_repo = None
        options: dict[str, Any] = {}
        for raw_key, value in parser.items(section):
            key = _preset_key(raw_key)
            value = value.strip()
            if key in PATH_KEYS:
                spec_path = Path(value).expanduser()
                if not spec_path.is_absolute():
                    spec_path = (path.expanduser().parent / spec_path)
            elif key in HF_KEYS:
                hf_repo = value
            elif key in ALIAS_KEYS:
                aliases = split_aliases(value)
            elif key in UPSTREAM_KEYS:
                upstreams += [UpstreamSpec.parse(line) for line in value.split() if line]
            elif key in STARTUP_KEYS:
                startup = value.lower() in TRUE_WORDS
            elif key in DEDUP_KEYS:
                dedup = value.lower() in TRUE_WORDS
            elif key in DRAFT_HF_KEYS:
                draft_repo = value
                if f"[{section}] {key}" not in ignored:
                    ignored.append(f"[{section}] {key}")
            else:
                flag = FLAGS_BY_SPELLING.get("--" + key) or FLAGS_BY_SPELLING.get("-" + key)
                if flag is not None and flag.dest in PER_MODEL:
                    negated = "--" + key in flag.negations
                    options[flag.dest] = ("false" if value.lower() in TRUE_WORDS else "true") if negated else value
                    if flag.dest in PRESET_PATHS:
                        options[flag.dest] = str(path.expanduser().parent / Path(value).expanduser())
                elif f"[{section}] {key}" not in ignored:
                    ignored.append(f"[{section}] {key}")
        if spec_path is None and hf_repo is None and not upstreams:
            raise ModelLoadError(f"preset {path}, [{section}]: no model, hf or upstream key says what to serve")
        try:
            settings = ServerSettings(**{**base.model_dump(), **options}) if options else None
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ModelLoadError(f"preset {path}, [{section}] {first['loc'][0]}: {first['msg']}") from None
        dedups = tuple(found for repo, file in ((hf_repo, options.get("hf_file")), (draft_repo, None))
                       if dedup and repo and (found := resolve_cached(repo, file)) is not None)
        specs.append(ModelSpec(name=section, aliases=aliases, path=spec_path, hf_repo=hf_repo,
                               upstreams=tuple(upstreams), settings=settings, load_on_startup=startup,
                               source="preset", dedups=dedups))
    return specs, ignored


def names_no_model(settings: ServerSettings) -> bool:
    """`kinetic serve` with no model source at all: the bundled model, or a router over the cache."""
    return not (settings.model_args or settings.model or settings.hf_repo or settings.models_dir
                or settings.models_preset or settings.upstream)


def serves_cache(settings: ServerSettings) -> bool:
    """Whether the cache's models join the router, as in llama-server's: with --models-dir, a preset, or no
    model named. Models named on kinetic's command line (-m/-hf repeated, --upstream) are served alone."""
    return not (settings.model_args or settings.model or settings.hf_repo or settings.upstream)


def from_hub_cache() -> list[ModelSpec]:
    """The Hugging Face cache's models, named `REPO:TAG`, each with its projector; removable (DELETE /models)."""
    return [ModelSpec(name=model.name, path=model.path, mmproj=model.mmproj, hf_repo=model.name, source="cache")
            for model in cached_models()]


def bundled_specs(settings: ServerSettings) -> list[ModelSpec]:
    """The bundled models in a router over the cache: first the default one (--bundled's) by its id or -a, and
    as `local` (ModelRegistry.default takes the first); then the others installed, by their ids."""
    default, _ = default_model(settings.bundled)
    aliases = split_aliases(settings.alias)
    specs = [ModelSpec(name=aliases[0] if aliases else default.name,
                       aliases=tuple(dict.fromkeys((*aliases, DEFAULT_ALIAS))), path=default.path(), source="bundled")]
    specs += [ModelSpec(name=other.name, path=other.path(), source="bundled")
              for other in BUNDLED if other != default and other.installed]
    return specs


def with_cache(specs: list[ModelSpec], cached: list[ModelSpec]) -> list[ModelSpec]:
    """The cache's models after the others (a name the others use is theirs, as llama-server's --models-dir
    and preset models win over the cache's), each hidden when a preset with dedup-cache-models serves its file."""
    taken = {name for spec in specs for name in spec.names}
    deduped = {path for spec in specs for path in spec.dedups}
    return specs + [replace(spec, hidden=spec.path in deduped) for spec in cached if spec.name not in taken]


def model_specs(settings: ServerSettings) -> tuple[list[ModelSpec], list[str]]:
    """Every model of a router's command line, and the preset keys to warn about."""
    specs = from_model_args(settings)
    ignored: list[str] = []
    if settings.models_dir:
        specs += from_models_dir(Path(settings.models_dir))
    if settings.models_preset:
        preset, ignored = read_preset(Path(settings.models_preset), settings)
        specs += preset
    specs += from_upstream_flags(settings.upstream)
    if names_no_model(settings):
        specs += bundled_specs(settings)
    seen: dict[str, ModelSpec] = {}
    for spec in specs:
        for name in spec.names:
            if name in seen:
                raise ModelLoadError(f"two models are named {name!r} ({seen[name].source} and {spec.source}): "
                                     "give one of them another alias")
            seen[name] = spec
    if serves_cache(settings):
        specs = with_cache(specs, from_hub_cache())
    if not specs:
        raise ModelLoadError(f"no model to serve: {settings.models_dir} holds no .gguf file")
    return specs, ignored
