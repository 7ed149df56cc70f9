"""Models downloaded while the router runs: llama-server's `POST /models` (and Ollama's /api/pull over it).

A download is checked first, in one short request (the repo exists, has a file for the quant), so that a
wrong name or a hub that cannot be reached is a one-line 400 at once, never a hang. It then runs in a
worker thread through huggingface_hub, into the same cache as -hf: a file already there is not fetched
again, and a connection dropped mid-file resumes where it stopped (huggingface_hub's Range retries).
Progress goes out on /models/sse as llama-server's router words it (`model_status` downloading, then
`download_progress` with `{"progress": {URL: {"done", "total"}}}`, then `download_finished` or
`download_failed`); when it is done the model joins the router's list (source `cache`, removable).
`/models/unload` cancels it: the next chunk read raises, and huggingface_hub drops its partial file.
Offline (--offline, HF_HUB_OFFLINE), a model the cache already holds is "downloaded" from it the same way,
with the same events (each file complete at once); only one that needs the network is refused.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from kinetic.backends.gguf_files import (
    best_mmproj,
    cached_hf_file,
    cached_hf_names,
    hub_files,
    offline_mode,
    pick_repo_gguf,
    shard_names,
    split_hf_repo,
)
from kinetic.config.settings import ServerSettings
from kinetic.errors import InvalidRequestError, KineticError, ModelLoadError
from kinetic.model_registry.events import ModelEvents

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.25  # llama-server throttles its progress events too; a listener needs no more


class DownloadCancelled(Exception):
    """Raised inside huggingface_hub's read loop when /models/unload cancels the download."""


@dataclass
class Download:
    name: str  # REPO[:QUANT], as POST /models named it
    repo: str
    files: list[str]  # the repo files to fetch, model shards first, then its projector
    aliases: tuple[str, ...] = ()  # the names it gets besides `name` once downloaded (/api/pull's hf.co/...)
    cached_only: bool = False  # offline: every file is read from the cache, none is asked of the hub
    progress: dict[str, dict[str, int]] = field(default_factory=dict)  # URL -> {"done", "total"}
    cancelled: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def url(self, filename: str) -> str:
        from huggingface_hub import hf_hub_url

        return hf_hub_url(self.repo, filename)


class ProgressBar:
    """What huggingface_hub is handed as its `tqdm_class`: counts bytes into the download's progress and
    stops the download when it is cancelled. A plain class, so huggingface_hub draws nothing."""

    def __init__(self, download: Download, report: Callable[[], None], url: str, total: int | None = None,
                 initial: int = 0, **_: Any):
        self.download, self.report = download, report
        self.row = download.progress.setdefault(url, {"done": 0, "total": 0})
        self.row.update(done=initial, total=total or 0)
        self.last = 0.0

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int | float = 1) -> None:
        if self.download.cancelled.is_set():
            raise DownloadCancelled(f"the download of {self.download.name} was cancelled")
        self.row["done"] += int(n)
        if (now := time.monotonic()) - self.last >= PROGRESS_EVERY_S:
            self.last = now
            self.report()

    def close(self) -> None:
        self.report()


def plan(name: str, settings: ServerSettings) -> Download:
    """Blocking: the files a download of `name` fetches, asked of the hub once with a short timeout.
    Every reason it cannot start is an InvalidRequestError of one line."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        repo, quant = split_hf_repo(name)
    except ModelLoadError as exc:
        raise InvalidRequestError(str(exc).replace("-hf value", "model"), param="model") from None
    if offline_mode(settings.offline):
        return plan_cached(name, repo, quant)
    try:
        files = hub_files(repo, settings.hf_token)
        model = pick_repo_gguf(repo, files, quant)
    except ModelLoadError as exc:
        raise InvalidRequestError(f"cannot download {name}: {exc}", param="model") from None
    except RepositoryNotFoundError:
        raise InvalidRequestError(f"cannot download {name}: {repo} was not found on Hugging Face "
                                  f"({constants.ENDPOINT})", param="model") from None
    except (httpx2.TransportError, HfHubHTTPError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise InvalidRequestError(f"cannot download {name}: Hugging Face ({constants.ENDPOINT}) cannot be reached "
                                  f"({type(exc).__name__}: {first})", param="model") from None
    projector = best_mmproj(files, model)
    return Download(name=name, repo=repo, files=shard_names(model) + ([projector] if projector else []))


def plan_cached(name: str, repo: str, quant: str | None) -> Download:
    """Blocking, offline: the same download, of files the Hugging Face cache already holds (found as -hf finds
    them at start); only a model that would need the network is refused."""
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        cached_hf_file(repo, quant, None, mmproj=True)  # every shard and the projector are there
        model, projector = cached_hf_names(repo, quant, None, mmproj=True)
    except (LocalEntryNotFoundError, ModelLoadError):
        raise InvalidRequestError(f"cannot download {name}: it is not in the Hugging Face cache "
                                  f"({constants.HF_HUB_CACHE}) and the network is off (--offline or HF_HUB_OFFLINE); "
                                  "start kinetic without it to download models", param="model") from None
    return Download(name=name, repo=repo, files=shard_names(model) + ([projector] if projector else []),
                    cached_only=True)


class Downloads:
    """The downloads under way, one per model name."""

    def __init__(self, settings: ServerSettings, events: ModelEvents, on_done: Callable[[Download], None]):
        self.settings = settings
        self.events = events
        self.on_done = on_done
        self.active: dict[str, Download] = {}

    async def start(self, name: str, aliases: tuple[str, ...] = ()) -> Download:
        if name in self.active:
            raise InvalidRequestError(f"model '{name}' is already downloading", param="model")
        try:
            download = replace(await anyio.to_thread.run_sync(plan, name, self.settings), aliases=aliases)
        except Exception as exc:
            if isinstance(exc, KineticError):
                raise
            raise InvalidRequestError(f"cannot download {name}: {type(exc).__name__}: {exc}".splitlines()[0],
                                      param="model") from None
        self.active[name] = download
        self.events.publish(name, "model_status", {"status": "downloading"})
        asyncio.get_running_loop().create_task(self._run(download))
        return download

    async def _run(self, download: Download) -> None:
        loop = asyncio.get_running_loop()

        def report() -> None:
            snapshot = {"progress": {url: dict(row) for url, row in download.progress.items()}}
            loop.call_soon_threadsafe(self.events.publish, download.name, "download_progress", snapshot)

        try:
            await anyio.to_thread.run_sync(self._fetch, download, report)
        except DownloadCancelled as exc:
            download.error = str(exc)
        except Exception as exc:  # any failure ends this download only, named in its event and the log
            download.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        finally:
            del self.active[download.name]
        if download.error is None:
            log.info("model %s downloaded", download.name)
            self.on_done(download)
            self.events.publish(download.name, "download_finished", {})
        else:
            log.warning("download of %s failed: %s", download.name, download.error)
            self.events.publish(download.name, "download_failed", {})
        download.done.set()

    def _fetch(self, download: Download, report: Callable[[], None]) -> None:
        import huggingface_hub

        for filename in download.files:
            url = download.url(filename)
            download.progress.setdefault(url, {"done": 0, "total": 0})
            bar = partial(ProgressBar, download, report, url)  # huggingface_hub calls it with the bar's arguments
            path = huggingface_hub.hf_hub_download(download.repo, filename, token=self.settings.hf_token,
                                                   local_files_only=download.cached_only,
                                                   tqdm_class=bar)  # type: ignore[call-overload]  # any callable
            # a file found in the cache draws no bar: it counts as fetched whole, at its size
            row = download.progress[url]
            row["done"] = row["total"] = max(row["total"], row["done"], Path(path).stat().st_size)
            report()

    def stop(self) -> None:
        """Shutdown: every download stops at its next chunk (no worker thread outlives the server)."""
        for download in self.active.values():
            download.cancelled.set()

    async def cancel(self, name: str) -> bool:
        """/models/unload of a model downloading: stops it, and waits for its end (as llama-server does)."""
        download = self.active.get(name)
        if download is None:
            return False
        download.cancelled.set()
        await download.done.wait()
        return True


def remove_cached(name: str) -> bool:
    """Blocking: deletes the files a `REPO[:QUANT]` model has in the Hugging Face cache (its GGUF and every
    shard, and its projector), each link and the blob it points at; False when none was there."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        repo, quant = split_hf_repo(name)
        model, projector = cached_hf_file(repo, quant, None, mmproj=True)
    except (LocalEntryNotFoundError, ModelLoadError):
        return False
    links = [model.with_name(shard) for shard in shard_names(model.name)]
    others = [p for p in model.parent.glob("*.gguf") if p not in links and p != projector]
    if projector is not None and not others:  # the projector goes with the repo's last model, not before
        links.append(projector)
    # the repo's own folder (models--ORG--REPO), which holds its blobs; the snapshot's file may sit in sub-folders
    repo_folder = next((p for p in model.parents if p.name.startswith("models--")), model.parent).resolve()
    for link in links:
        blob = link.resolve()
        link.unlink(missing_ok=True)
        # the blob goes only when it is the cache's own: a link a user made to a file elsewhere leaves that file
        if blob != link and blob.is_relative_to(repo_folder):
            blob.unlink(missing_ok=True)
    return True
