"""Read the workflow a bisect replays, whatever file the user has: an API prompt, a UI workflow,
or an image ComfyUI saved with the prompt inside.

``oom-bisect run --workflow FILE`` takes what users actually keep: the API JSON they exported,
a ``POST /prompt`` body, a ``/history`` entry or ``/queue`` item, the editor's saved workflow
(schema 0.4 or 1), or an output PNG (``tEXt``/``zTXt``/``iTXt`` chunks ``prompt`` and
``workflow``) or animated WebP (EXIF strings ``prompt:…``/``workflow:…``) — comfyui-facts §6.
When a file carries both forms the API prompt wins: the embedded UI workflow reflects the
editor *after* queueing, so its seed may already be the next one (§6.3).

The PNG and WebP readers are a few dozen lines of ``struct``/``zlib`` rather than a Pillow
dependency; they read only the metadata chunks and seek past the pixels. Every problem is an
``InputError`` with one line naming the file and what is wrong.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from oom_sentinel.bisect.workflow.ui_to_api import ConversionResult, convert, is_ui_workflow
from oom_sentinel.daemon.core.errors import InputError

__all__ = [
    "MAX_JSON_BYTES",
    "MAX_TEXT_CHUNK_BYTES",
    "LoadedWorkflow",
    "SourceKind",
    "load_workflow",
    "parse_workflow_document",
    "read_png_text",
    "read_webp_text",
    "validate_api_prompt",
]

#: A workflow JSON larger than this is refused (real ones are kilobytes to a few megabytes).
MAX_JSON_BYTES = 64 * 1024 * 1024
#: The most text one PNG/WebP metadata chunk may hold, compressed or not (a zip-bomb guard).
MAX_TEXT_CHUNK_BYTES = 64 * 1024 * 1024

SourceKind = Literal["api", "prompt-request", "history", "queue-item", "job", "ui", "png", "webp"]

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_TEXT_CHUNKS = (b"tEXt", b"zTXt", b"iTXt")
_WANTED_KEYS = ("prompt", "workflow")


@dataclass(frozen=True)
class LoadedWorkflow:
    """What a workflow file held. At least one of ``api_prompt`` / ``ui_workflow`` is set."""

    path: Path
    #: where the prompt came from: the file's format, or the wrapper it was found in
    kind: SourceKind
    #: the API prompt (``{id: {class_type, inputs}}``) exactly as stored, ids as strings
    api_prompt: dict[str, Any] | None
    #: the editor's UI workflow, when the file carried one
    ui_workflow: dict[str, Any] | None
    #: what was odd but not fatal (e.g. an unreadable embedded prompt next to a good workflow)
    notes: tuple[str, ...] = ()

    @property
    def needs_conversion(self) -> bool:
        """True when only the UI form exists: replaying needs the target's ``/object_info``."""
        return self.api_prompt is None

    def to_api(self, object_info: Mapping[str, Any]) -> ConversionResult:
        """The prompt to replay: the stored API prompt, else the UI workflow converted with
        ``object_info`` of the ComfyUI that will run it."""
        if self.api_prompt is not None:
            return ConversionResult(prompt=self.api_prompt, warnings=[])
        assert self.ui_workflow is not None
        try:
            result = convert(self.ui_workflow, object_info)
        except InputError as exc:
            raise InputError(f"{self.path}: {exc}") from exc
        if not result.prompt:
            raise InputError(f"{self.path}: the UI workflow has no node the server can run")
        return result


def load_workflow(path: str | Path) -> LoadedWorkflow:
    """Read ``path`` (JSON, PNG or WebP) and return the prompt and/or workflow it carries."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            head = fh.read(12)
            fh.seek(0)
            if head.startswith(_PNG_SIGNATURE):
                texts = read_png_text(fh, str(p))
                return _from_image(p, "png", texts)
            if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
                texts = read_webp_text(fh, str(p))
                return _from_image(p, "webp", texts)
            data = fh.read(MAX_JSON_BYTES + 1)
    except IsADirectoryError as exc:
        raise InputError(f"{p}: is a directory, not a workflow file") from exc
    except FileNotFoundError as exc:
        raise InputError(f"{p}: no such file") from exc
    except PermissionError as exc:
        raise InputError(f"{p}: permission denied") from exc
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    if len(data) > MAX_JSON_BYTES:
        raise InputError(
            f"{p}: larger than {MAX_JSON_BYTES // (1024 * 1024)} MiB; not a workflow file"
        )
    if not data.strip():
        raise InputError(f"{p}: empty file; expected a workflow (JSON, PNG or WebP)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{p}: not a workflow: neither JSON text nor a PNG/WebP image "
            f"(undecodable byte at offset {exc.start})"
        ) from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{p}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})"
        ) from exc
    except RecursionError as exc:
        raise InputError(f"{p}: JSON nested too deeply") from exc
    return parse_workflow_document(doc, p)


def parse_workflow_document(doc: Any, path: Path) -> LoadedWorkflow:
    """Recognise one decoded JSON document; ``path`` only names it in errors."""
    if isinstance(doc, list):
        if _is_queue_item(doc):
            return _queue_item(doc, path, "queue-item")
        raise InputError(
            f"{path}: a JSON array that is not a queue item [number, id, prompt, extra_data, outputs]"
        )
    if not isinstance(doc, Mapping):
        raise InputError(f"{path}: JSON {type(doc).__name__}, not a workflow object")
    if not doc:
        raise InputError(f"{path}: an empty JSON object, not a workflow")
    if _looks_like_api(doc):
        return LoadedWorkflow(path, "api", validate_api_prompt(doc, path), None)
    if is_ui_workflow(doc):
        return LoadedWorkflow(path, "ui", None, _ui_or_fail(doc, path))
    prompt = doc.get("prompt")
    if isinstance(prompt, Mapping) and (
        "client_id" in doc or "extra_data" in doc or _looks_like_api(prompt)
    ):
        api = validate_api_prompt(prompt, path, where="'prompt'")
        ui = _ui_from_extra(doc.get("extra_data"))
        sibling = doc.get("workflow")
        if ui is None and isinstance(sibling, Mapping) and is_ui_workflow(sibling):
            ui = dict(sibling)  # {"prompt": ..., "workflow": ...}, as some tools save both
        return LoadedWorkflow(path, "prompt-request", api, ui)
    if isinstance(prompt, list) and _is_queue_item(prompt):
        return _queue_item(prompt, path, "history")
    if "queue_running" in doc or "queue_pending" in doc:
        return _queue_response(doc, path)
    workflow = doc.get("workflow")
    if isinstance(workflow, Mapping) and isinstance(workflow.get("prompt"), Mapping):
        api = validate_api_prompt(workflow["prompt"], path, where="'workflow.prompt'")
        return LoadedWorkflow(path, "job", api, _ui_from_extra(workflow.get("extra_data")))
    if isinstance(workflow, Mapping) and is_ui_workflow(workflow):
        return LoadedWorkflow(path, "ui", None, _ui_or_fail(workflow, path))
    entries = [
        v for v in doc.values() if isinstance(v, Mapping) and isinstance(v.get("prompt"), list)
    ]
    if entries and len(entries) == len(doc):
        if len(entries) > 1:
            ids = ", ".join(list(map(str, doc))[:3])
            raise InputError(
                f"{path}: a /history response with {len(entries)} entries ({ids}, ...); "
                "save one entry (GET /history/<prompt_id>)"
            )
        entry = entries[0]
        if _is_queue_item(entry["prompt"]):
            return _queue_item(entry["prompt"], path, "history")
    raise InputError(
        f"{path}: JSON that is neither an API prompt ({{id: {{class_type, inputs}}}}) "
        "nor a UI workflow (a 'nodes' list)"
    )


def validate_api_prompt(doc: Mapping[str, Any], path: Path, where: str = "") -> dict[str, Any]:
    """Check the API prompt shape and return it with string node ids."""
    prefix = f"{path}: {where + ': ' if where else ''}"
    if not isinstance(doc, Mapping) or not doc:
        raise InputError(f"{prefix}an API prompt must be a non-empty object")
    out: dict[str, Any] = {}
    for node_id, node in doc.items():
        if not isinstance(node, Mapping):
            raise InputError(f"{prefix}node {node_id!r} is not an object")
        if not isinstance(node.get("class_type"), str) or not node["class_type"]:
            raise InputError(f"{prefix}node {node_id!r} has no 'class_type'")
        inputs = node.get("inputs", {})
        if not isinstance(inputs, Mapping):
            raise InputError(f"{prefix}node {node_id!r}: 'inputs' is not an object")
        out[str(node_id)] = dict(node)
    return out


# --------------------------------------------------------------------------------------------
# JSON shapes


def _looks_like_api(doc: Mapping[str, Any]) -> bool:
    return bool(doc) and all(
        isinstance(v, Mapping) and isinstance(v.get("class_type"), str) for v in doc.values()
    )


def _is_queue_item(item: Any) -> bool:
    return (
        isinstance(item, list)
        and len(item) >= 3
        and isinstance(item[1], str | int)
        and isinstance(item[2], Mapping)
    )


def _queue_item(item: list[Any], path: Path, kind: SourceKind) -> LoadedWorkflow:
    api = validate_api_prompt(item[2], path, where=f"{kind} prompt")
    extra = item[3] if len(item) > 3 else None
    return LoadedWorkflow(path, kind, api, _ui_from_extra(extra))


def _queue_response(doc: Mapping[str, Any], path: Path) -> LoadedWorkflow:
    running = doc.get("queue_running") or []
    pending = doc.get("queue_pending") or []
    if isinstance(running, list) and len(running) == 1 and _is_queue_item(running[0]):
        return _queue_item(running[0], path, "queue-item")
    raise InputError(
        f"{path}: a /queue response with {len(running) if isinstance(running, list) else '?'} "
        f"running and {len(pending) if isinstance(pending, list) else '?'} pending items; "
        "need exactly one running item (or save one item)"
    )


def _ui_from_extra(extra: Any) -> dict[str, Any] | None:
    if not isinstance(extra, Mapping):
        return None
    pnginfo = extra.get("extra_pnginfo")
    workflow = pnginfo.get("workflow") if isinstance(pnginfo, Mapping) else None
    return dict(workflow) if isinstance(workflow, Mapping) and is_ui_workflow(workflow) else None


def _ui_or_fail(doc: Mapping[str, Any], path: Path) -> dict[str, Any]:
    links = doc.get("links")
    if links is not None and not isinstance(links, list | Mapping):
        raise InputError(f"{path}: UI workflow 'links' is not a list")
    return dict(doc)


# --------------------------------------------------------------------------------------------
# Images


def _from_image(path: Path, kind: SourceKind, texts: Mapping[str, str]) -> LoadedWorkflow:
    api: dict[str, Any] | None = None
    ui: dict[str, Any] | None = None
    problems: list[str] = []
    if "prompt" in texts:
        try:
            doc = json.loads(texts["prompt"])
            api = validate_api_prompt(doc, path, where="embedded 'prompt'")
        except json.JSONDecodeError as exc:
            problems.append(f"the embedded 'prompt' is not valid JSON ({exc.msg})")
        except InputError as exc:
            problems.append(str(exc).removeprefix(f"{path}: "))
    if "workflow" in texts:
        try:
            doc = json.loads(texts["workflow"])
            if is_ui_workflow(doc):
                ui = dict(doc)
            else:
                problems.append("the embedded 'workflow' is not a UI workflow")
        except json.JSONDecodeError as exc:
            problems.append(f"the embedded 'workflow' is not valid JSON ({exc.msg})")
    if api is None and ui is None:
        what = (
            "; ".join(problems)
            if problems
            else (
                "no 'prompt' or 'workflow' metadata (saved with --disable-metadata, or not by ComfyUI)"
            )
        )
        raise InputError(f"{path}: {kind.upper()} without a usable workflow: {what}")
    return LoadedWorkflow(path, kind, api, ui, tuple(problems))


def read_png_text(fh: IO[bytes], name: str) -> dict[str, str]:
    """The ``prompt``/``workflow`` text chunks of a PNG (tEXt, zTXt or iTXt), by keyword.

    Pixel data is skipped with ``seek``; every chunk header is checked so a truncated file is
    reported rather than half-read. CRCs are verified for the chunks we keep.
    """
    size = _size(fh)
    if fh.read(8) != _PNG_SIGNATURE:
        raise InputError(f"{name}: not a PNG file")
    texts: dict[str, str] = {}
    offset = 8
    while True:
        header = fh.read(8)
        if len(header) == 0:
            raise InputError(f"{name}: truncated PNG (no IEND chunk; file ends at byte {offset})")
        if len(header) < 8:
            raise InputError(f"{name}: truncated PNG (chunk header cut at byte {offset})")
        length, ctype = struct.unpack(">I4s", header)
        if length > 0x7FFFFFFF:
            raise InputError(f"{name}: corrupt PNG (chunk length {length} at byte {offset})")
        if ctype in _PNG_TEXT_CHUNKS:
            if length > MAX_TEXT_CHUNK_BYTES:
                raise InputError(f"{name}: PNG text chunk of {length} bytes is too large")
            body = fh.read(length)
            crc = fh.read(4)
            if len(body) < length or len(crc) < 4:
                raise InputError(
                    f"{name}: truncated PNG ({ctype.decode()} chunk at byte {offset} cut short)"
                )
            if zlib.crc32(header[4:] + body) != struct.unpack(">I", crc)[0]:
                raise InputError(
                    f"{name}: corrupt PNG (CRC mismatch in {ctype.decode()} chunk at byte {offset})"
                )
            parsed = _png_text_chunk(ctype, body, name)
            if parsed is not None and parsed[0] in _WANTED_KEYS:
                texts.setdefault(parsed[0], parsed[1])
        else:
            if offset + 12 + length > size:
                raise InputError(
                    f"{name}: truncated PNG ({ctype.decode('latin-1')} chunk at byte {offset} "
                    f"wants {length} bytes, {max(size - offset - 12, 0)} left)"
                )
            fh.seek(length + 4, 1)
        offset += 12 + length
        if ctype == b"IEND":
            return texts


def _size(fh: IO[bytes]) -> int:
    here = fh.tell()
    end = fh.seek(0, 2)
    fh.seek(here)
    return end


def _png_text_chunk(ctype: bytes, body: bytes, name: str) -> tuple[str, str] | None:
    key, sep, rest = body.partition(b"\x00")
    if not sep:
        return None
    keyword = key.decode("latin-1")
    if keyword not in _WANTED_KEYS:
        return None
    if ctype == b"tEXt":
        return keyword, rest.decode("latin-1")
    if ctype == b"zTXt":
        if not rest or rest[0] != 0:
            raise InputError(f"{name}: PNG zTXt chunk '{keyword}' uses an unknown compression")
        return keyword, _inflate(rest[1:], name, keyword).decode("latin-1")
    # iTXt: flag, method, language\0, translated keyword\0, UTF-8 text
    if len(rest) < 2:
        raise InputError(f"{name}: PNG iTXt chunk '{keyword}' is malformed")
    flag, method = rest[0], rest[1]
    _lang, _s1, rest2 = rest[2:].partition(b"\x00")
    _translated, _s2, text = rest2.partition(b"\x00")
    if flag:
        if method != 0:
            raise InputError(f"{name}: PNG iTXt chunk '{keyword}' uses an unknown compression")
        text = _inflate(text, name, keyword)
    return keyword, text.decode("utf-8", errors="replace")


def _inflate(data: bytes, name: str, keyword: str) -> bytes:
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, MAX_TEXT_CHUNK_BYTES)
    except zlib.error as exc:
        raise InputError(f"{name}: PNG text chunk '{keyword}' does not decompress ({exc})") from exc
    if inflater.unconsumed_tail:
        raise InputError(
            f"{name}: PNG text chunk '{keyword}' inflates past "
            f"{MAX_TEXT_CHUNK_BYTES // (1024 * 1024)} MiB"
        )
    return out


def read_webp_text(fh: IO[bytes], name: str) -> dict[str, str]:
    """``prompt``/``workflow`` from a WebP's EXIF chunk, where ComfyUI's SaveAnimatedWEBP puts
    ``"prompt:" + json`` (tag 0x0110) and ``"workflow:" + json`` (tags from 0x010F down)."""
    file_size = _size(fh)
    header = fh.read(12)
    if len(header) < 12 or header[:4] != b"RIFF" or header[8:12] != b"WEBP":
        raise InputError(f"{name}: not a WebP file")
    texts: dict[str, str] = {}
    offset = 12
    while True:
        chunk = fh.read(8)
        if not chunk:
            return texts
        if len(chunk) < 8:
            raise InputError(f"{name}: truncated WebP (chunk header cut at byte {offset})")
        fourcc, size = struct.unpack("<4sI", chunk)
        padded = size + (size & 1)
        if fourcc == b"EXIF":
            if size > MAX_TEXT_CHUNK_BYTES:
                raise InputError(f"{name}: WebP EXIF chunk of {size} bytes is too large")
            body = fh.read(size)
            if len(body) < size:
                raise InputError(f"{name}: truncated WebP (EXIF chunk at byte {offset} cut short)")
            fh.seek(padded - size, 1)
            for text in _exif_strings(body):
                key, sep, value = text.partition(":")
                if sep and key in _WANTED_KEYS:
                    texts.setdefault(key, value)
        else:
            if offset + 8 + size > file_size:
                raise InputError(
                    f"{name}: truncated WebP ({fourcc.decode('latin-1')} chunk at byte {offset} "
                    f"wants {size} bytes)"
                )
            fh.seek(padded, 1)
        offset += 8 + padded


def _exif_strings(body: bytes) -> list[str]:
    """ASCII/UNDEFINED values of IFD0 in a TIFF-structured EXIF block (best effort)."""
    if body.startswith(b"Exif\x00\x00"):
        body = body[6:]
    if len(body) < 8 or body[:2] not in (b"II", b"MM"):
        return []
    endian = "<" if body[:2] == b"II" else ">"
    (ifd,) = struct.unpack(endian + "I", body[4:8])
    if ifd + 2 > len(body):
        return []
    (count,) = struct.unpack(endian + "H", body[ifd : ifd + 2])
    out: list[str] = []
    for k in range(count):
        at = ifd + 2 + 12 * k
        if at + 12 > len(body):
            break
        _tag, kind, n = struct.unpack(endian + "HHI", body[at : at + 8])
        if kind not in (2, 7):  # ASCII, UNDEFINED
            continue
        if n <= 4:
            raw = body[at + 8 : at + 8 + n]
        else:
            (ptr,) = struct.unpack(endian + "I", body[at + 8 : at + 12])
            raw = body[ptr : ptr + n]
        out.append(raw.rstrip(b"\x00").decode("utf-8", errors="replace"))
    return out
