"""Where the GGUF comes from: a path, a Hugging Face repo (-hf), or a bundled model (kinetic.backends.bundled)."""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from kinetic.backends.bundled import by_name, default_model
from kinetic.backends.kinetic_cache import cache_dir
from kinetic.errors import ModelLoadError

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
# Tried in order when -hf names no quant and the repo has no Q4_K_M (llama-server's "latest" tag).
FALLBACK_QUANTS = ("Q4_K_M", "Q4_0", "Q8_0")
SHARD_PATTERN = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
# llama.cpp's get_gguf_split_info: a split file's prefix, and the quant tag that ends a file name
SPLIT_PREFIX = re.compile(r"(.+)-([0-9]{5})-of-([0-9]{5})", re.IGNORECASE)
TAG_PATTERN = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
MMPROJ_KEYWORD = "mmproj"  # a projector file's name holds it (case matters, as in llama.cpp)


@dataclass(frozen=True)
class ResolvedModel:
    path: Path
    name: str  # the id clients see when no --alias is given
    note: str | None = None  # one line worth telling the user (e.g. the cached copy is used)
    mmproj: Path | None = None  # the repo's multimodal projector, fetched beside the model (-hf, --mmproj-auto)


def check_gguf(path: Path, what: str = "model") -> Path:
    """Fail fast, naming the file, when it is missing or not a GGUF."""
    if not path.exists():
        raise ModelLoadError(f"{what} file not found: {path}")
    if not path.is_file():
        raise ModelLoadError(f"{what} path is not a file: {path}")
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {what} file {path}: {exc.strerror}") from exc
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"not a GGUF file (bad magic {magic!r}): {path}")
    return path


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


def quant_tag(path: str) -> str:
    """llama.cpp's get_gguf_split_info tag: `dir/x-Q4_K_M-00001-of-00002.gguf` -> `Q4_K_M` ('' for none)."""
    if not path.endswith(".gguf"):
        return ""
    prefix = path.removesuffix(".gguf")
    if match := SPLIT_PREFIX.fullmatch(prefix):
        prefix = match.group(1)
    match = TAG_PATTERN.search(prefix)
    return match.group(1).upper() if match else ""


def quant_bits(tag: str) -> int:
    """The first number of a quant tag (llama.cpp's extract_quant_bits): Q4_0 -> 4, BF16 -> 16, none -> 0."""
    match = re.search(r"\d+", tag)
    return int(match.group()) if match else 0


def best_sibling(files: list[str], model: str, keyword: str, tag: str = "") -> str | None:
    """llama.cpp's find_best_sibling: of the repo's GGUFs whose path holds `keyword`, in the model's folder
    or one above it, the one in the deepest folder, then the one named with `-TAG.`, then the one whose
    quant bits are closest to the tag's (or, with no tag, the model's); the first listed wins a tie."""
    tag = tag.upper()
    model_bits = quant_bits(tag) if tag else quant_bits(quant_tag(model))
    model_dirs = model.split("/")[:-1]
    best: str | None = None
    best_key = (-1, False, 0)
    for name in files:
        dirs = name.split("/")[:-1]
        if not name.endswith(".gguf") or keyword not in name or dirs != model_dirs[:len(dirs)]:
            continue
        key = (len(dirs), bool(tag) and f"-{tag}." in name.upper(), -abs(quant_bits(quant_tag(name)) - model_bits))
        if best is None or key > best_key:
            best, best_key = name, key
    return best


def best_mmproj(files: list[str], model: str) -> str | None:
    """The projector -hf fetches with `model` (llama.cpp's find_best_mmproj: no tag, so the model's bits)."""
    return best_sibling(files, model, MMPROJ_KEYWORD)


def cached_hf_names(repo: str, quant: str | None, hf_file: str | None = None,
                    mmproj: bool = False) -> tuple[str, str | None]:
    """The repo file an -hf spec names, and with `mmproj` the repo's projector beside it (or None), chosen
    among the GGUFs the Hugging Face cache holds (LocalEntryNotFoundError if the repo is absent)."""
    import huggingface_hub

    snapshot = Path(huggingface_hub.snapshot_download(repo, local_files_only=True))
    # what the cache holds is the offline file list, as llama.cpp's get_cached_files reads it
    files = [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*.gguf")]
    filename = hf_file or pick_repo_gguf(repo, files, quant)
    return filename, best_mmproj(files, filename) if mmproj else None


def cached_hf_file(repo: str, quant: str | None, hf_file: str | None,
                   mmproj: bool = False) -> tuple[Path, Path | None]:
    """The GGUF an -hf spec names, and with `mmproj` the repo's projector beside it, from the Hugging Face
    cache only (LocalEntryNotFoundError if the model or one of its shards is absent)."""
    import huggingface_hub

    filename, projector = cached_hf_names(repo, quant, hf_file, mmproj)
    paths = [huggingface_hub.hf_hub_download(repo, shard, local_files_only=True) for shard in shard_names(filename)]
    if projector is None:
        return Path(paths[0]), None
    return Path(paths[0]), Path(huggingface_hub.hf_hub_download(repo, projector, local_files_only=True))


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


def resolve_hf(spec: str, hf_file: str | None, offline: bool, token: str | None = None, *,
               mmproj: bool = True) -> ResolvedModel:
    """Download (or take from the Hugging Face cache) the GGUF an -hf spec names, and with `mmproj`
    (--mmproj-auto, no -mm or -mmu) the repo's projector that goes with it (best_mmproj).

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
            path, projector = cached_hf_file(repo, quant, hf_file, mmproj)
        except LocalEntryNotFoundError:
            raise ModelLoadError(f"{spec} is not in the Hugging Face cache ({cache}) and the network is off "
                                 "(offline mode): run once without --offline to download it, or pass -m PATH "
                                 "to a local GGUF file") from None
        return resolved(path, name, projector)
    try:
        files = hub_files(repo, token)  # first, so that an unreachable hub is known after one short try
        if hf_file and hf_file not in files:
            raise ModelLoadError(f"{repo} has no file {hf_file} (-hff); its GGUF files: "
                                 + ", ".join(f for f in files if f.endswith(".gguf")))
        filename = hf_file or pick_repo_gguf(repo, files, quant)
        path = download_hf_file(repo, filename, token)
        projector_name = best_mmproj(files, filename) if mmproj else None
        projector = download_hf_file(repo, projector_name, token) if projector_name else None
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
            path, projector = cached_hf_file(repo, quant, hf_file, mmproj)
        except (LocalEntryNotFoundError, ModelLoadError):
            raise ModelLoadError(f"cannot get {spec}: Hugging Face ({hf_constants.ENDPOINT}) cannot be reached "
                                 f"({reason}) and the model is not in the Hugging Face cache ({cache}); "
                                 + UNREACHABLE_ADVICE) from None
        note = f"Hugging Face ({hf_constants.ENDPOINT}) cannot be reached ({reason}); using the cached copy {path}"
        return resolved(path, name, projector, note)
    except OSError as exc:
        raise ModelLoadError(f"cannot store {spec} in the Hugging Face cache ({cache}): "
                             f"{exc.strerror or exc}") from None
    return resolved(path, name, projector)


def resolved(path: Path, name: str, projector: Path | None, note: str | None = None) -> ResolvedModel:
    """Both files checked, each error naming its own."""
    return ResolvedModel(path=check_gguf(path), name=name, note=note,
                         mmproj=check_gguf(projector, "projector") if projector else None)


def offline_mode(offline: bool) -> bool:
    """--offline, or huggingface_hub's HF_HUB_OFFLINE (its own truthy words), read now rather than at its import."""
    return offline or os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def projector_cache_path(url: str) -> Path:
    """Where -mmu stores its file without -mm: kinetic's cache, under the URL's file name (llama-server's
    rule, in its own cache)."""
    name = url.split("#")[0].split("?")[0].rstrip("/").rsplit("/", 1)[-1]
    return cache_dir() / "mmproj" / (name or "mmproj.gguf")


def download_url(url: str, target: Path, *, offline: bool) -> Path:
    """-mmu: `url` written to `target` once, with huggingface_hub's progress bar; a file already there is
    used as it is (no request), so a later start needs no network."""
    if target.exists():
        return target
    if offline_mode(offline):
        raise ModelLoadError(f"the projector {url} (-mmu) is not downloaded ({target}) and the network is off "
                             "(offline mode): run once without --offline, or pass -mm PATH to a local file")
    import httpx
    from huggingface_hub.utils import tqdm

    partial = target.with_name(target.name + ".partial")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with httpx.stream("GET", url, follow_redirects=True, timeout=HUB_CHECK_TIMEOUT) as response:
            response.raise_for_status()
            size = int(response.headers.get("Content-Length") or 0) or None
            with partial.open("wb") as out, tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024,
                                                 desc=target.name) as bar:
                for chunk in response.iter_bytes(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
        os.replace(partial, target)
    except httpx.HTTPStatusError as exc:
        raise ModelLoadError(f"cannot download the projector {url} (-mmu): HTTP {exc.response.status_code}") from None
    except httpx.HTTPError as exc:
        raise ModelLoadError(f"cannot download the projector {url} (-mmu): {_network_failure(exc)}; to start "
                             "without the network, pass -mm PATH to a local projector file") from None
    except OSError as exc:
        raise ModelLoadError(f"cannot write the projector {url} (-mmu) to {target}: {exc.strerror or exc}") from None
    finally:
        partial.unlink(missing_ok=True)
    return target


def resolve_projector(path: str | None, url: str | None, found: Path | None, *, offline: bool) -> Path | None:
    """The projector a model loads: -mmu's download (into `path`, -mm's or the cache's), else -mm's file,
    else the one found beside the model (-hf's, a --models-dir sub-folder's); each checked to be a GGUF."""
    if url:
        assert path is not None, "model_config() gives -mmu a path"
        return check_gguf(download_url(url, Path(path), offline=offline), "projector")
    if path:
        return check_gguf(Path(path).expanduser(), "projector")
    return check_gguf(found, "projector") if found else None


def model_file(value: str) -> tuple[Path, str]:
    """-m's file and the name it is served by: the path given (named as given), or, where no such file is,
    the bundled model of that name (`-m gemma`, named by its id)."""
    path = Path(value).expanduser()
    if not path.exists() and (named := by_name(value)) is not None:
        return named.path(), named.name
    return path, value


def resolve_model(model: str | None, hf_repo: str | None, hf_file: str | None, offline: bool,
                  token: str | None = None, *, mmproj: bool = True, bundled: str | None = None) -> ResolvedModel:
    """The precedence llama-server uses: an explicit path (or, where no such file is, a bundled model's name:
    `-m gemma`), then -hf (with its projector when `mmproj`), then (kinetic's) default bundled model, which
    `bundled` (--bundled) may choose."""
    if model:
        path, name = model_file(model)
        return ResolvedModel(path=check_gguf(path), name=name)
    if hf_repo:
        return resolve_hf(hf_repo, hf_file, offline, token, mmproj=mmproj)
    chosen, note = default_model(bundled)
    return ResolvedModel(path=check_gguf(chosen.path()), name=chosen.name, note=note)


@functools.cache
def projector_inputs(path: Path) -> tuple[bool, bool]:
    """(vision, audio): what a projector file reads, from its GGUF keys, without loading it (llama.cpp's
    mtmd_get_cap_from_file, which llama-server's router lists before a model is loaded); neither when the
    file cannot be read."""
    import gguf

    try:
        fields = gguf.GGUFReader(str(path)).fields
    except (OSError, ValueError):
        return False, False

    def flag(key: str) -> bool:
        field = fields.get(key)
        return bool(field is not None and field.contents())

    return flag("clip.has_vision_encoder"), flag("clip.has_audio_encoder")
