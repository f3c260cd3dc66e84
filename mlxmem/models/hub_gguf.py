"""A GGUF file from the Hugging Face hub (a registry entry's `gguf_repo` and `gguf_file`),
downloaded once into the models folder as the file llama.cpp runs, and kept only if its
SHA-256 is the expected one.

The expected hash is the entry's pinned `gguf_sha256` where it has one: the shipped entries
do, so a file replaced on the hub is refused rather than run. An entry without one (a
models.toml of the person's own) is checked against the SHA-256 the hub reports for the file's
LFS object, which catches a corrupt or truncated download but trusts the hub.

huggingface_hub downloads into a staging folder beside the target (`.NAME.gguf.download`,
where an interrupted download resumes), and the file is renamed into place once checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from mlxmem.errors import ModelLoadError, ModelNotFoundError


def download_gguf(
    repo: str,
    filename: str,
    dest: Path,
    sha256: str | None = None,
    size: int | None = None,
    progress: bool = True,
) -> Path:
    """Download `filename` of the hub repo `repo` into `dest`, checked by SHA-256 (`sha256`,
    else the hub's) and size (`size`, when given); return `dest`. A mismatch leaves nothing."""
    from huggingface_hub import hf_hub_download

    staging = staging_dir(dest)
    try:
        with _hub_errors(f"{repo}/{filename}"):
            check_reachable()
            expected = sha256 or hub_sha256(repo, filename)
            with progress_bars(progress):
                got = Path(hf_hub_download(repo, filename, local_dir=staging))
    except ModelNotFoundError:
        if not any(p.is_file() and p.stat().st_size for p in staging.rglob("*")):
            shutil.rmtree(staging, ignore_errors=True)  # nothing to resume from
        raise
    try:
        check_file(got, expected.lower(), size, progress)
    except ModelLoadError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    os.replace(got, dest)
    shutil.rmtree(staging, ignore_errors=True)
    return dest


def staging_dir(dest: Path) -> Path:
    """Where the download of `dest` is made, and resumes after an interruption."""
    return dest.with_name(f".{dest.name}.download")


def check_reachable(timeout: float = 5.0) -> None:
    """Raise ModelNotFoundError at once when the hub's host cannot be reached: a TCP connection
    to it, opened and closed, as the download would open it anyway. Without this, a machine
    with no network spends half a minute in huggingface_hub's retries before the default model
    falls back to one from the package index. Skipped behind a proxy, which may reach what a
    direct connection cannot."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    proxies = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
    if any(os.environ.get(name) for name in proxies):
        return
    url = urlsplit(constants.ENDPOINT)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise ModelNotFoundError(f"cannot reach {host} ({exc.strerror or exc})") from None


def hub_sha256(repo: str, filename: str) -> str:
    """The SHA-256 the hub reports for the LFS object of `filename` in `repo`."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    found = HfApi().get_paths_info(repo, [filename])
    info = next((f for f in found if isinstance(f, RepoFile) and f.path == filename), None)
    if info is None:
        raise ModelNotFoundError(f"{repo} has no file {filename} on the hub")
    if info.lfs is None:
        raise ModelLoadError(
            f"the hub reports no SHA-256 for {repo}/{filename} (not an LFS file); pin one with "
            "gguf_sha256 in models.toml"
        )
    return info.lfs.sha256


def check_file(path: Path, sha256: str, size: int | None, progress: bool) -> None:
    """Raise ModelLoadError unless `path` has this SHA-256 (and `size` bytes, when given)."""
    from .gguf import _progress

    actual_size = path.stat().st_size
    if size is not None and actual_size != size:
        raise ModelLoadError(
            f"{path.name} has {actual_size:,} bytes, not the {size:,} expected; refused"
        )
    digest = hashlib.sha256()
    with open(path, "rb") as f, _progress(progress, "Checking SHA-256", actual_size, True) as step:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            step(len(chunk))
    if digest.hexdigest() != sha256:
        raise ModelLoadError(
            f"{path.name}: its SHA-256 is {digest.hexdigest()}, not {sha256}: it differs from the "
            "file expected (changed on the hub, or corrupt); refused"
        )


@contextlib.contextmanager
def _hub_errors(what: str) -> Iterator[None]:
    """The hub's failures as ModelNotFoundError: the file cannot be fetched (from here, now)."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        yield
    except LocalEntryNotFoundError:  # the hub did not answer: not cached, and not fetched
        raise ModelNotFoundError(f"cannot download {what}: the hub did not answer") from None
    except (RepositoryNotFoundError, GatedRepoError, EntryNotFoundError) as exc:
        raise ModelNotFoundError(
            f"{what} is not on the Hugging Face hub, or needs a login ({type(exc).__name__})"
        ) from None
    except (ModelNotFoundError, ModelLoadError):
        raise
    except Exception as exc:  # network errors come from several libraries; all mean the same
        text = str(exc).strip().splitlines()
        raise ModelNotFoundError(
            f"cannot download {what} from the Hugging Face hub ({type(exc).__name__}"
            f"{': ' + text[0] if text else ''})"
        ) from exc


@contextlib.contextmanager
def progress_bars(enabled: bool) -> Iterator[None]:
    """huggingface_hub's progress bars on or off for the duration."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    if enabled != are_progress_bars_disabled():  # already as asked
        yield
        return
    (enable_progress_bars if enabled else disable_progress_bars)()
    try:
        yield
    finally:
        (disable_progress_bars if enabled else enable_progress_bars)()
