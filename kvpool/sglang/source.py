"""Where SGLang's source comes from: an installed package, a checkout or wheel path, or a version.

A :class:`SGLangSource` reads ``.py`` files by their path inside the distribution
(``sglang/srt/mem_cache/radix_cache.py``) from a directory root (the folder holding
``sglang/``) or straight out of a wheel (a zip); nothing is imported or extracted. A published
version is fetched with ``pip download --no-deps sglang==VERSION`` into a cache folder
(``$KVPOOL_SGLANG_CACHE``, else ``~/.cache/kvpool/sglang``) the first time, then reused.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from kvpool.errors import SGLangLoadError

_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+([.+-]?[0-9A-Za-z.]+)?$")
_SCM_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


def default_cache_dir() -> Path:
    """``$KVPOOL_SGLANG_CACHE`` if set, else ``~/.cache/kvpool/sglang``."""
    env = os.environ.get("KVPOOL_SGLANG_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kvpool" / "sglang"


def download_wheel(version: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The wheel of SGLang ``version`` in ``cache_dir`` (default :func:`default_cache_dir`),
    fetched with ``pip download --no-deps`` when no ``sglang-VERSION-*.whl`` is there yet.
    Raises :class:`~kvpool.errors.SGLangLoadError` (with pip's last output) when pip fails."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    pattern = f"sglang-{version}-*.whl"
    found = sorted(cache.glob(pattern))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", f"sglang=={version}"]
        done = subprocess.run([*cmd, "-d", str(cache)], capture_output=True, text=True)
        found = sorted(cache.glob(pattern))
        if done.returncode != 0 or not found:
            raise SGLangLoadError(
                f"could not download SGLang {version} into {cache}: "
                + pip_failure(done.stderr or done.stdout)
            )
    return found[-1]


_PIP_VERSIONS_RE = re.compile(r" \(from versions: [^)]*\)")
PIP_FAILURE_CHARS = 300
"""At most this many characters of pip's output go into a download error (one line)."""


def pip_failure(output: str) -> str:
    """pip's reason for a failed download, for a one-line error: its ``ERROR:`` lines (else its
    last three lines), joined by `` | ``, without the index's list of every release (``(from
    versions: ...)``, thousands of characters) and cut to :data:`PIP_FAILURE_CHARS`."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    text = " | ".join(_PIP_VERSIONS_RE.sub("", line) for line in errors or lines[-3:])
    if len(text) > PIP_FAILURE_CHARS:
        text = text[: PIP_FAILURE_CHARS - 3] + "..."
    return text or "pip gave no output"


_OPEN_WHEELS: dict[tuple[Path, int], zipfile.ZipFile] = {}


def _open_wheel(wheel: Path) -> zipfile.ZipFile:
    """``wheel`` opened once per process and kept open: opening a zip reads its whole directory
    (thousands of entries, tens of milliseconds), and loading SGLang reads a few hundred files.
    Keyed by process id too: a forked worker opens its own (a file offset shared with its parent
    would mix their reads). Reads are thread-safe (``ZipFile`` locks its file)."""
    key = (wheel, os.getpid())
    zf = _OPEN_WHEELS.get(key)
    if zf is None:
        zf = _OPEN_WHEELS[key] = zipfile.ZipFile(wheel)
    return zf


@dataclass(frozen=True)
class SGLangSource:
    """SGLang's files: under directory ``root`` (which holds ``sglang/``) or inside wheel
    ``wheel``. ``version`` is the release number read from the source (``0.0.0`` if none)."""

    origin: str
    version: str
    root: Path | None = None
    wheel: Path | None = None
    _names: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def read(self, relpath: str) -> str | None:
        """Text of file ``relpath`` (``/``-separated, e.g. ``sglang/srt/utils/common.py``), or
        None if the source has no such file."""
        if self.root is not None:
            path = self.root / relpath
            return path.read_text(encoding="utf-8") if path.is_file() else None
        if relpath not in self._names:
            return None
        assert self.wheel is not None
        return _open_wheel(self.wheel).read(relpath).decode("utf-8")

    def filename(self, relpath: str) -> str:
        """A readable name for tracebacks: the real path, or ``WHEEL/relpath``."""
        base = self.root if self.root is not None else self.wheel
        assert base is not None
        return str(base / relpath)

    def names(self, prefix: str) -> list[str]:
        """Distribution paths under folder ``prefix`` (``a/b/``), sorted."""
        if self.root is not None:
            base = self.root / prefix
            if not base.is_dir():
                return []
            return sorted(f"{prefix}{p.name}" for p in base.iterdir() if p.is_file())
        inside = (n for n in self._names if n.startswith(prefix))
        return sorted(n for n in inside if "/" not in n[len(prefix) :])

    def binary_path(self, relpath: str) -> Path:
        """A file on disk holding ``relpath`` (a compiled module): the real file of a folder
        source, or a copy extracted once from the wheel into
        ``default_cache_dir()/extracted/WHEEL_STEM/relpath`` (a dynamic loader needs a path)."""
        if self.root is not None:
            return self.root / relpath
        assert self.wheel is not None
        dest = default_cache_dir() / "extracted" / self.wheel.stem / relpath
        if not dest.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            partial = dest.with_name(f"{dest.name}.{os.getpid()}.part")
            partial.write_bytes(_open_wheel(self.wheel).read(relpath))
            partial.replace(dest)  # atomic: concurrent workers never load a half-written file
        return dest

    def key(self) -> str:
        """Identifies the source (the loader caches one set of modules per key)."""
        return str(self.root if self.root is not None else self.wheel)


def _from_dir(root: Path, origin: str) -> SGLangSource:
    source = SGLangSource(origin=origin, version="0.0.0", root=root)
    return SGLangSource(origin=origin, version=_read_version(source), root=root)


def _from_wheel(wheel: Path, origin: str) -> SGLangSource:
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = frozenset(zf.namelist())
    except (OSError, zipfile.BadZipFile) as exc:
        raise SGLangLoadError(f"{wheel} is not a readable wheel: {exc}") from None
    if "sglang/__init__.py" not in names:
        raise SGLangLoadError(f"{wheel} holds no sglang package")
    source = SGLangSource(origin=origin, version="0.0.0", wheel=wheel, _names=names)
    version = _read_version(source)
    if version == "0.0.0":  # the wheel's file name is sglang-VERSION-...
        version = wheel.name.split("-")[1] if wheel.name.count("-") >= 2 else version
    return SGLangSource(origin=origin, version=version, wheel=wheel, _names=names)


def _read_version(source: SGLangSource) -> str:
    """``sglang/_version.py`` (setuptools-scm), else ``pyproject.toml`` next to ``sglang/``."""
    text = source.read("sglang/_version.py")
    found = _SCM_VERSION_RE.search(text) if text else None
    if found:
        return found.group(1)
    text = source.read("pyproject.toml")
    found = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M) if text else None
    return found.group(1) if found else "0.0.0"


def resolve_source(source: str, cache_dir: str | os.PathLike[str] | None = None) -> SGLangSource:
    """``source`` is ``"installed"`` (the ``sglang`` package importable here, found without
    importing it), a release number like ``"0.5.16"`` (downloaded, see :func:`download_wheel`),
    or a path: a wheel file, a directory holding ``sglang/``, a checkout holding
    ``python/sglang/``, or the ``sglang`` package folder itself. Raises
    :class:`~kvpool.errors.SGLangLoadError` when there is no SGLang there."""
    if source == "installed":
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise SGLangLoadError("no installed sglang package")
        root = Path(next(iter(spec.submodule_search_locations))).parent
        found = _from_dir(root, "installed")
        if found.version == "0.0.0":
            try:
                version = importlib.metadata.version("sglang")
            except importlib.metadata.PackageNotFoundError:
                return found
            return SGLangSource(origin="installed", version=version, root=root)
        return found
    if _VERSION_RE.match(source) and not Path(source).exists():
        return _from_wheel(download_wheel(source, cache_dir), f"sglang=={source}")
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".whl":
        return _from_wheel(path, str(path))
    for root in (path, path / "python", path.parent):
        if (root / "sglang" / "__init__.py").is_file() and (
            root != path.parent or path.name == "sglang"
        ):
            return _from_dir(root, str(path))
    raise SGLangLoadError(
        f"no SGLang source at {source!r}: expected a wheel, a folder holding sglang/ or "
        "python/sglang/, or a release number such as '0.5.16'"
    )


__all__ = [
    "PIP_FAILURE_CHARS",
    "SGLangSource",
    "default_cache_dir",
    "download_wheel",
    "pip_failure",
    "resolve_source",
]
