"""Real wheels for the per-state environment tests, built without a network (issue 14, item 4).

Two sources, both ending as ordinary ``.whl`` files in a folder that uv reads with
``--find-links`` (``UV_FIND_LINKS``) and ``UV_OFFLINE=1``:

* ``write_wheel``: a pure-Python wheel written by hand (a zip with ``*.dist-info/METADATA``,
  ``WHEEL`` and ``RECORD``, as PEP 427 describes): ``sentinel-ballast``, whose versions make
  the stand-in's allocations bigger, and anything else a case needs.
* ``repack_installed``: a distribution this interpreter already has (``aiohttp``, ``psutil``,
  ``PyYAML`` and their dependencies, which the stand-in ComfyUI imports) packed back into a wheel from
  its installed files and its own ``WHEEL`` tag, so a per-state venv can hold the stand-in's
  runtime without downloading anything.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import re
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = [
    "STANDIN_RUNTIME",
    "ballast_source",
    "ballast_wheelhouse",
    "repack_closure",
    "repack_installed",
    "write_wheel",
]

#: what the stand-in ComfyUI imports beyond the standard library
STANDIN_RUNTIME = ("aiohttp", "psutil", "PyYAML")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name)


def _zip(
    out_dir: Path, name: str, version: str, tags: list[str], files: Mapping[str, bytes], meta: str
) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    dist_info = f"{_norm(name)}-{version}.dist-info"
    all_files = dict(files)
    all_files[f"{dist_info}/METADATA"] = meta.encode()
    all_files[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: oom-sentinel-tests\nRoot-Is-Purelib: "
        f"{'true' if all(t.endswith('none-any') for t in tags) else 'false'}\n"
        + "".join(f"Tag: {t}\n" for t in tags)
    ).encode()
    parts = [t.split("-") for t in tags]  # a compressed tag set (PEP 425): py2.py3-none-any
    tag = "-".join(".".join(dict.fromkeys(p[i] for p in parts)) for i in range(3))
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in all_files.items())
    record += f"{dist_info}/RECORD,,\n"
    path = out_dir / f"{_norm(name)}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in all_files.items():
            z.writestr(p, d)
        z.writestr(f"{dist_info}/RECORD", record)
    return path


def write_wheel(
    out_dir: Path,
    name: str,
    version: str,
    files: Mapping[str, str | bytes],
    requires: Iterable[str] = (),
) -> Path:
    """A pure-Python wheel ``name-version-py3-none-any.whl`` holding ``files``."""
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    data = {p: c.encode() if isinstance(c, str) else c for p, c in files.items()}
    return _zip(out_dir, name, version, ["py3-none-any"], data, meta)


def ballast_source(scale: float, pad_bytes: int = 0) -> dict[str, str | bytes]:
    """``sentinel_ballast``: a node that imports it scales the stand-in's VRAM node by SCALE.
    ``pad_bytes`` adds a data file, to give hard links something to save."""
    files: dict[str, str | bytes] = {
        "sentinel_ballast/__init__.py": f'"""test ballast"""\nSCALE = {scale!r}\n'
    }
    if pad_bytes:
        files["sentinel_ballast/pad.bin"] = bytes(pad_bytes)
    return files


def repack_installed(name: str, out_dir: Path) -> Path:
    """The installed distribution ``name`` as a wheel (its files as installed, its own tag)."""
    dist = md.distribution(name)
    wheel_meta = dist.read_text("WHEEL") or ""
    tags = [ln.split(":", 1)[1].strip() for ln in wheel_meta.splitlines() if ln.startswith("Tag:")]
    version = dist.version
    dist_info = f"{_norm(dist.metadata['Name'])}-{version}.dist-info"
    files: dict[str, bytes] = {}
    for f in dist.files or ():
        rel = str(f).replace("\\", "/")
        if rel.startswith("..") or "__pycache__" in rel or rel.endswith(".pyc"):
            continue
        if rel.split("/", 1)[0].endswith(".dist-info"):  # any spelling of the name
            base = rel.rsplit("/", 1)[-1]
            if base in ("RECORD", "WHEEL", "METADATA", "INSTALLER", "REQUESTED", "direct_url.json"):
                continue
            rel = f"{dist_info}/{base}"
        path = Path(str(f.locate()))
        if path.is_file():
            files[rel] = path.read_bytes()
    meta = (
        dist.read_text("METADATA") or f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )
    return _zip(out_dir, dist.metadata["Name"], version, tags or ["py3-none-any"], files, meta)


def _requirements(name: str) -> list[str]:
    out = []
    for req in md.requires(name) or ():
        if "extra ==" in req or "extra==" in req:
            continue
        dep = re.match(r"[A-Za-z0-9._-]+", req)
        marker = req.split(";", 1)[1] if ";" in req else ""
        if dep and ('python_version < "3.' not in marker or "3.1" in marker):
            out.append(dep.group(0))
    return out


def repack_closure(names: Iterable[str], out_dir: Path) -> dict[str, str]:
    """Each of ``names`` and what it requires (as installed here) as wheels in ``out_dir``;
    returns {normalised name: version}, the package set they make."""
    todo = list(names)
    done: dict[str, str] = {}
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in done:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # a marker-excluded requirement (e.g. for older Pythons)
        repack_installed(name, out_dir)
        done[key] = dist.version
        todo.extend(_requirements(name))
    return done


def ballast_wheelhouse(out_dir: Path) -> dict[str, str]:
    """The stand-in's runtime plus ``sentinel-ballast`` 1.0 (SCALE 1.0) and 2.0 (SCALE 1.6)
    as wheels in ``out_dir``; returns the runtime's package set."""
    runtime = repack_closure(STANDIN_RUNTIME, out_dir)
    write_wheel(out_dir, "sentinel-ballast", "1.0", ballast_source(1.0))
    write_wheel(out_dir, "sentinel-ballast", "2.0", ballast_source(1.6))
    return runtime
