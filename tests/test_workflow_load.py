"""Reading the workflow file a bisect replays: every JSON shape users keep, images ComfyUI wrote,
and every way such a file can be bad (one line naming the file, never a traceback)."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from oom_sentinel.bisect.workflow import load as wfmod
from oom_sentinel.bisect.workflow.load import LoadedWorkflow, load_workflow
from oom_sentinel.daemon.core.errors import EXIT_INPUT, InputError

HERE = Path(__file__).parent / "workflows"
OBJECT_INFO = json.loads((HERE / "object_info.json").read_text())
UI = json.loads((HERE / "txt2img.workflow.json").read_text())
API = json.loads((HERE / "txt2img.expected.json").read_text())


# --------------------------------------------------------------------------------------------
# Image writers (the layouts ComfyUI's PIL-based savers produce)


def png_chunk(ctype: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + ctype + body + struct.pack(">I", zlib.crc32(ctype + body))


def png(*texts: tuple[bytes, bytes], idat: bytes = b"\x00" * 64) -> bytes:
    ihdr = struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0)
    chunks = [png_chunk(b"IHDR", ihdr)]
    chunks += [png_chunk(ctype, body) for ctype, body in texts]
    chunks += [png_chunk(b"IDAT", zlib.compress(idat)), png_chunk(b"IEND", b"")]
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunks)


def text(key: str, value: Any) -> tuple[bytes, bytes]:
    return b"tEXt", key.encode() + b"\x00" + json.dumps(value).encode("latin-1")


def ztext(key: str, value: Any) -> tuple[bytes, bytes]:
    return b"zTXt", key.encode() + b"\x00\x00" + zlib.compress(json.dumps(value).encode())


def itext(key: str, value: Any, compressed: bool) -> tuple[bytes, bytes]:
    data = json.dumps(value, ensure_ascii=False).encode("utf-8")
    if compressed:
        data = zlib.compress(data)
    return b"iTXt", key.encode() + b"\x00" + bytes([int(compressed), 0]) + b"en\x00\x00" + data


def exif(strings: dict[int, str], big_endian: bool = False, header: bool = True) -> bytes:
    """A TIFF IFD0 with ASCII entries, as PIL's Image.Exif.tobytes() lays it out."""
    e = ">" if big_endian else "<"
    entries, blobs = [], b""
    data_start = 8 + 2 + 12 * len(strings) + 4
    for tag, value in sorted(strings.items()):
        raw = value.encode("utf-8") + b"\x00"
        entries.append(struct.pack(e + "HHII", tag, 2, len(raw), data_start + len(blobs)))
        blobs += raw + (b"\x00" if len(raw) % 2 else b"")
    tiff = (b"MM" if big_endian else b"II") + struct.pack(e + "HI", 42, 8)
    tiff += struct.pack(e + "H", len(strings)) + b"".join(entries) + b"\x00\x00\x00\x00" + blobs
    return (b"Exif\x00\x00" if header else b"") + tiff


def webp(exif_body: bytes | None) -> bytes:
    chunks = b""
    for fourcc, body in (
        (b"VP8X", b"\x0a" + b"\x00" * 9),
        (b"ANIM", b"\x00" * 6),
        (b"ANMF", b"\x00" * 17),
    ):
        chunks += fourcc + struct.pack("<I", len(body)) + body + (b"\x00" if len(body) % 2 else b"")
    if exif_body is not None:
        chunks += (
            b"EXIF"
            + struct.pack("<I", len(exif_body))
            + exif_body
            + (b"\x00" if len(exif_body) % 2 else b"")
        )
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WEBP" + chunks


def write(tmp_path: Path, name: str, data: bytes | str | Any) -> Path:
    path = tmp_path / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    elif isinstance(data, str):
        path.write_text(data)
    else:
        path.write_text(json.dumps(data))
    return path


def assert_one_line(exc: InputError, path: Path) -> None:
    message = str(exc)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert exc.exit_code == EXIT_INPUT


# --------------------------------------------------------------------------------------------
# JSON shapes


def test_api_prompt_is_read_as_is(tmp_path: Path) -> None:
    loaded = load_workflow(write(tmp_path, "api.json", API))
    assert loaded == LoadedWorkflow(tmp_path / "api.json", "api", API, None)
    assert not loaded.needs_conversion
    assert loaded.to_api(OBJECT_INFO).prompt == API


def test_ui_workflow_needs_conversion_and_converts(tmp_path: Path) -> None:
    loaded = load_workflow(write(tmp_path, "ui.json", UI))
    assert loaded.kind == "ui" and loaded.api_prompt is None and loaded.needs_conversion
    result = loaded.to_api(OBJECT_INFO)
    assert result.prompt == API and result.warnings == []


def test_schema1_ui_workflow_is_recognised(tmp_path: Path) -> None:
    doc = json.loads((HERE / "nested_subgraph.workflow.json").read_text())
    loaded = load_workflow(write(tmp_path, "v1.json", doc))
    assert loaded.kind == "ui"
    assert loaded.to_api(OBJECT_INFO).prompt == json.loads(
        (HERE / "nested_subgraph.expected.json").read_text()
    )


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(API).encode())
    assert load_workflow(path).api_prompt == API


def test_prompt_request_body_carries_both_forms(tmp_path: Path) -> None:
    body = {"prompt": API, "client_id": "abc", "extra_data": {"extra_pnginfo": {"workflow": UI}}}
    loaded = load_workflow(write(tmp_path, "post.json", body))
    assert loaded.kind == "prompt-request"
    assert loaded.api_prompt == API and loaded.ui_workflow == UI


def test_prompt_and_workflow_side_by_side(tmp_path: Path) -> None:
    loaded = load_workflow(write(tmp_path, "both.json", {"prompt": API, "workflow": UI}))
    assert loaded.kind == "prompt-request"
    assert loaded.api_prompt == API and loaded.ui_workflow == UI


def test_history_entry_is_unwrapped(tmp_path: Path) -> None:
    entry = {
        "prompt": [3, "pid-1", API, {"client_id": "x", "extra_pnginfo": {"workflow": UI}}, ["9"]],
        "outputs": {},
        "status": {"status_str": "success", "completed": True, "messages": []},
    }
    for doc in ({"pid-1": entry}, entry):
        loaded = load_workflow(write(tmp_path, "history.json", doc))
        assert loaded.kind == "history"
        assert loaded.api_prompt == API and loaded.ui_workflow == UI


def test_history_with_several_entries_asks_for_one(tmp_path: Path) -> None:
    entry = {"prompt": [3, "p", API, {}, ["9"]], "outputs": {}}
    path = write(tmp_path, "history.json", {"a": entry, "b": entry})
    with pytest.raises(InputError, match="2 entries") as info:
        load_workflow(path)
    assert_one_line(info.value, path)


def test_queue_item_and_queue_response(tmp_path: Path) -> None:
    item = [7, "pid-2", API, {"extra_pnginfo": {"workflow": UI}}, ["9"]]
    assert load_workflow(write(tmp_path, "item.json", item)).kind == "queue-item"
    loaded = load_workflow(
        write(tmp_path, "queue.json", {"queue_running": [item], "queue_pending": []})
    )
    assert loaded.api_prompt == API and loaded.ui_workflow == UI
    path = write(tmp_path, "queue2.json", {"queue_running": [], "queue_pending": [item, item]})
    with pytest.raises(InputError, match="0 running and 2 pending") as info:
        load_workflow(path)
    assert_one_line(info.value, path)


def test_single_job_form_is_unwrapped(tmp_path: Path) -> None:
    job = {
        "id": "j",
        "status": "failed",
        "workflow": {"prompt": API, "extra_data": {"extra_pnginfo": {"workflow": UI}}},
    }
    loaded = load_workflow(write(tmp_path, "job.json", job))
    assert loaded.kind == "job" and loaded.api_prompt == API and loaded.ui_workflow == UI


def test_numeric_node_ids_become_strings(tmp_path: Path) -> None:
    path = write(tmp_path, "api.json", '{"3": {"class_type": "ImageInvert", "inputs": {}}}')
    assert list(load_workflow(path).api_prompt or {}) == ["3"]


# --------------------------------------------------------------------------------------------
# Images


def test_png_with_both_prefers_the_api_prompt(tmp_path: Path) -> None:
    ran = json.loads(json.dumps(API))
    ran["3"]["inputs"]["seed"] = 1111  # the UI workflow already holds the next seed
    path = write(tmp_path, "out.png", png(text("prompt", ran), text("workflow", UI)))
    loaded = load_workflow(path)
    assert loaded.kind == "png" and loaded.ui_workflow == UI
    assert loaded.to_api(OBJECT_INFO).prompt["3"]["inputs"]["seed"] == 1111


@pytest.mark.parametrize(
    "chunk",
    [
        ztext("workflow", UI),
        itext("workflow", UI, compressed=True),
        itext("workflow", UI, compressed=False),
    ],
    ids=["zTXt", "iTXt-compressed", "iTXt-plain"],
)
def test_png_text_chunk_kinds(tmp_path: Path, chunk: tuple[bytes, bytes]) -> None:
    loaded = load_workflow(write(tmp_path, "w.png", png(chunk)))
    assert loaded.kind == "png" and loaded.api_prompt is None and loaded.ui_workflow == UI


def test_png_unrelated_text_chunks_are_ignored(tmp_path: Path) -> None:
    path = write(
        tmp_path, "a.png", png((b"tEXt", b"parameters\x00a1111 style"), text("prompt", API))
    )
    assert load_workflow(path).api_prompt == API


def test_png_with_a_broken_prompt_falls_back_to_the_workflow_and_notes_it(tmp_path: Path) -> None:
    path = write(tmp_path, "b.png", png((b"tEXt", b"prompt\x00{not json"), text("workflow", UI)))
    loaded = load_workflow(path)
    assert loaded.api_prompt is None and loaded.ui_workflow == UI
    assert loaded.notes and "not valid JSON" in loaded.notes[0]


BAD_PNGS = {
    "no-metadata": (png(), "without a usable workflow: no 'prompt' or 'workflow' metadata"),
    "truncated-in-pixels": (png(text("prompt", API), idat=b"\x01" * 5000)[:-40], "truncated PNG"),
    "truncated-in-text": (png(text("prompt", API))[:60], "truncated PNG"),
    "no-iend": (png(text("prompt", API))[:-12], "no IEND"),
    "bad-crc": (png(text("prompt", API)).replace(b"KSampler", b"KSamplex", 1), "CRC mismatch"),
    "prompt-not-json": (png((b"tEXt", b"prompt\x00{nope")), "embedded 'prompt' is not valid JSON"),
    "prompt-not-api": (png(text("prompt", {"a": 1})), "node 'a' is not an object"),
    "bad-zlib": (png((b"zTXt", b"workflow\x00\x00not zlib")), "does not decompress"),
}


@pytest.mark.parametrize("name", sorted(BAD_PNGS), ids=sorted(BAD_PNGS))
def test_bad_png_is_one_input_error(tmp_path: Path, name: str) -> None:
    data, message = BAD_PNGS[name]
    path = write(tmp_path, f"{name}.png", data)
    with pytest.raises(InputError, match=message) as info:
        load_workflow(path)
    assert_one_line(info.value, path)


def test_png_text_that_inflates_too_far_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wfmod, "MAX_TEXT_CHUNK_BYTES", 4096)
    path = write(
        tmp_path, "bomb.png", png((b"zTXt", b"workflow\x00\x00" + zlib.compress(b"[" * 100_000)))
    )
    with pytest.raises(InputError, match="inflates past") as info:
        load_workflow(path)
    assert_one_line(info.value, path)


@pytest.mark.parametrize(
    ("big_endian", "header"),
    [(False, True), (True, True), (False, False)],
    ids=["little-endian", "big-endian", "bare-tiff"],
)
def test_animated_webp_exif_carries_prompt_and_workflow(
    tmp_path: Path, big_endian: bool, header: bool
) -> None:
    body = exif(
        {0x0110: "prompt:" + json.dumps(API), 0x010F: "workflow:" + json.dumps(UI)},
        big_endian,
        header,
    )
    loaded = load_workflow(write(tmp_path, "anim.webp", webp(body)))
    assert loaded.kind == "webp" and loaded.api_prompt == API and loaded.ui_workflow == UI


def test_webp_without_exif_is_an_input_error(tmp_path: Path) -> None:
    path = write(tmp_path, "plain.webp", webp(None))
    with pytest.raises(InputError, match="WEBP without a usable workflow") as info:
        load_workflow(path)
    assert_one_line(info.value, path)


def test_truncated_webp_is_an_input_error(tmp_path: Path) -> None:
    body = exif({0x0110: "prompt:" + json.dumps(API)})
    path = write(tmp_path, "cut.webp", webp(body)[:-50])
    with pytest.raises(InputError, match="truncated WebP") as info:
        load_workflow(path)
    assert_one_line(info.value, path)


# --------------------------------------------------------------------------------------------
# Bad input of every other kind


BAD_FILES: dict[str, tuple[bytes | str | Any, str]] = {
    "not-json": ("{'nodes': [}", "not valid JSON \\(line 1 column 2"),
    "empty": ("", "empty file"),
    "whitespace": ("  \n", "empty file"),
    "binary": (b"\x00\xff\xfe garbage", "neither JSON text nor a PNG/WebP image"),
    "neither-format": ({"hello": "world"}, "neither an API prompt"),
    "empty-object": ({}, "an empty JSON object"),
    "number": (42, "JSON int, not a workflow object"),
    "array": ([1, 2, 3], "not a queue item"),
    "node-without-class": (
        {"1": {"class_type": "KSampler", "inputs": {}}, "2": {"inputs": {}}},
        "neither an API prompt",
    ),
    "inputs-not-object": (
        {"1": {"class_type": "KSampler", "inputs": []}},
        "'inputs' is not an object",
    ),
    "ui-links-not-list": ({"nodes": [], "links": 5}, "'links' is not a list"),
    "deep": ("[" * 100000 + "]" * 100000, "nested too deeply|not a queue item"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES), ids=sorted(BAD_FILES))
def test_bad_file_is_one_input_error(tmp_path: Path, name: str) -> None:
    data, message = BAD_FILES[name]
    path = write(tmp_path, f"{name}.json", data)
    with pytest.raises(InputError, match=message) as info:
        load_workflow(path)
    assert_one_line(info.value, path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file") as info:
        load_workflow(tmp_path / "nope.json")
    assert_one_line(info.value, tmp_path / "nope.json")
    with pytest.raises(InputError, match="is a directory") as info:
        load_workflow(tmp_path)
    assert_one_line(info.value, tmp_path)


def test_huge_json_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wfmod, "MAX_JSON_BYTES", 1024)
    path = write(tmp_path, "big.json", {"pad": "x" * 4096})
    with pytest.raises(InputError, match="larger than") as info:
        load_workflow(path)
    assert_one_line(info.value, path)


def test_ui_workflow_with_nothing_to_run(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "notes.json",
        {"nodes": [{"id": 1, "type": "Note", "widgets_values": ["hi"]}], "links": []},
    )
    with pytest.raises(InputError, match="no node the server can run") as info:
        load_workflow(path).to_api(OBJECT_INFO)
    assert_one_line(info.value, path)
