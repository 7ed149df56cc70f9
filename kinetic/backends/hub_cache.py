"""The models a Hugging Face cache holds, read from disk as llama-server's router reads them (llama.cpp's
common/hf-cache.cpp and common_list_cached_models): no network, no huggingface_hub call.

The cache folder is llama.cpp's: LLAMA_CACHE (the hub folder itself), then HF_HUB_CACHE,
HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub. Each repo
folder `models--ORG--NAME` has `refs/main` (else any ref) naming the snapshot whose files are the repo's. A
model is a GGUF with a quant tag (`-Q8_0.gguf`), the first shard of a split one, and not a projector or a
draft head; it is named `ORG/NAME:TAG`, as `-hf` takes it. Its projector is the repo's best `mmproj` file
for it (gguf_files.best_mmproj, the rule `-hf` uses).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from kinetic.backends.gguf_files import MMPROJ_KEYWORD, SPLIT_PREFIX, best_mmproj, quant_tag, split_hf_repo
from kinetic.errors import ModelLoadError

# what llama.cpp's common_list_cached_models skips besides projectors: speculative heads shipped beside a model
DRAFT_PREFIXES = ("mtp-", "eagle3-", "dflash-", "dspark-")
COMMIT = re.compile(r"[0-9a-fA-F]{40}")
REPO_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# -hf without a quant: the tags llama.cpp's find_best_model tries, in order, before the first model file
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")


def hub_cache_dir() -> Path:
    """The hub folder, in llama.cpp's order (common/hf-cache.cpp get_cache_directory)."""
    for variable, below in (("LLAMA_CACHE", ()), ("HF_HUB_CACHE", ()), ("HUGGINGFACE_HUB_CACHE", ()),
                            ("HF_HOME", ("hub",)), ("XDG_CACHE_HOME", ("huggingface", "hub"))):
        if value := os.environ.get(variable):
            return Path(value).expanduser().joinpath(*below)
    return Path.home() / ".cache" / "huggingface" / "hub"


@dataclass(frozen=True)
class CachedModel:
    """One model of the cache: `repo:tag`, its GGUF (first shard) and the projector that goes with it."""

    repo: str
    tag: str
    path: Path
    mmproj: Path | None

    @property
    def name(self) -> str:
        return f"{self.repo}:{self.tag}"


def _snapshot(repo_folder: Path) -> Path | None:
    """The snapshot `refs/main` names, else the first valid ref's (llama.cpp's get_cached_ref)."""
    refs = repo_folder / "refs"
    if not refs.is_dir():
        return None
    commits = []
    for ref in sorted(refs.iterdir()):
        try:
            commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else ""
        except OSError:
            continue
        if COMMIT.fullmatch(commit):
            commits.append((ref.name != "main", commit))
    for _, commit in sorted(commits):
        if (snapshot := repo_folder / "snapshots" / commit).is_dir():
            return snapshot
    return None


def _repo_id(folder: str) -> str | None:
    """`models--ggml-org--models` -> `ggml-org/models` (None for a dataset's or a malformed folder)."""
    if not folder.startswith("models--"):
        return None
    owner, _, name = folder.removeprefix("models--").partition("--")
    name = name.replace("--", "/")
    return f"{owner}/{name}" if REPO_PART.fullmatch(owner) and REPO_PART.fullmatch(name) else None


def repo_files(root: Path | None = None) -> dict[str, tuple[Path, list[str]]]:
    """Each cached repo's snapshot folder and its files (paths relative to it, `/`-separated, sorted)."""
    root = root or hub_cache_dir()
    found: dict[str, tuple[Path, list[str]]] = {}
    try:
        folders = sorted(root.iterdir())
    except OSError:
        return found
    for folder in folders:
        repo = _repo_id(folder.name)
        snapshot = _snapshot(folder) if repo and folder.is_dir() else None
        if repo is None or snapshot is None:
            continue
        files = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
        found[repo] = (snapshot, files)
    return found


def is_model_file(path: str) -> bool:
    """A model GGUF: not a projector, not a draft head (llama.cpp's gguf_filename_is_model)."""
    return path.endswith(".gguf") and MMPROJ_KEYWORD not in path and not any(p in path for p in DRAFT_PREFIXES)


def _first_shard(path: str) -> bool:
    match = SPLIT_PREFIX.fullmatch(path.removesuffix(".gguf"))
    return match is None or int(match.group(2)) == 1


def cached_models(root: Path | None = None) -> list[CachedModel]:
    """Every model of the cache, once per `repo:tag` (the first file of a tag wins, as in llama.cpp)."""
    models: dict[str, CachedModel] = {}
    for repo, (snapshot, files) in repo_files(root).items():
        for path in files:
            tag = quant_tag(path)
            if not tag or not is_model_file(path) or not _first_shard(path) or f"{repo}:{tag}" in models:
                continue
            projector = best_mmproj(files, path)
            models[f"{repo}:{tag}"] = CachedModel(repo, tag, snapshot / path,
                                                  snapshot / projector if projector else None)
    return list(models.values())


def resolve_cached(spec: str, hf_file: str | None = None, root: Path | None = None) -> Path | None:
    """The cached file `-hf spec` (with `--hf-file`) loads, or None (llama.cpp's common_download_resolve_path:
    the file named, else the first model file tagged as asked, else Q4_K_M, Q8_0, then the first model)."""
    try:
        repo, tag = split_hf_repo(spec)
    except ModelLoadError:
        return None
    snapshot, files = repo_files(root).get(repo, (None, []))
    if snapshot is None:
        return None
    if hf_file:
        return snapshot / hf_file if hf_file in files else None
    models = [f for f in files if is_model_file(f) and _first_shard(f)]
    for wanted in [tag] if tag else list(DEFAULT_TAGS):
        pattern = re.compile(re.escape(wanted) + r"[.-]", re.IGNORECASE)
        for path in models:
            if pattern.search(path):
                return snapshot / path
    return snapshot / models[0] if models and not tag else None
