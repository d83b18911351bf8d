"""Workflow identities: the exact-replay hash keys the bisect's cache, the fingerprint keys run
history and must not change with what ComfyUI re-rolls on every queue."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from oom_sentinel.daemon.comfy.prompt_fingerprint import (
    canonical_json,
    workflow_fingerprint,
    workflow_hash,
)

HERE = Path(__file__).parent / "workflows"
OBJECT_INFO = json.loads((HERE / "object_info.json").read_text())
API: dict[str, Any] = json.loads((HERE / "txt2img.expected.json").read_text())


def changed(**edits: Any) -> dict[str, Any]:
    """API with ``node__input=value`` edits (``node___meta`` replaces _meta)."""
    prompt = copy.deepcopy(API)
    for key, value in edits.items():
        node_id, name = key.split("__", 1)
        if name == "_meta":
            prompt[node_id]["_meta"] = value
        else:
            prompt[node_id]["inputs"][name] = value
    return prompt


@pytest.mark.parametrize(
    "other",
    [
        changed(**{"3__seed": 42}),
        changed(**{"9__filename_prefix": "run-2/img"}),
        changed(**{"3___meta": {"title": "My sampler"}}),
        {k: v for k, v in reversed(list(API.items()))},
        changed(**{"3__cfg": 8.0}),
    ],
    ids=["new-seed", "new-prefix", "new-title", "key-order", "int-as-float"],
)
def test_fingerprint_ignores_per_run_noise(other: dict[str, Any]) -> None:
    assert workflow_fingerprint(other) == workflow_fingerprint(API)


@pytest.mark.parametrize(
    "other",
    [
        changed(**{"3__steps": 21}),
        changed(**{"5__width": 1024}),
        changed(**{"6__text": "a cottage"}),
        changed(**{"3__model": ["5", 0]}),
        {k: v for k, v in API.items() if k != "9"},
    ],
    ids=["steps", "resolution", "prompt-text", "rewired", "node-removed"],
)
def test_fingerprint_sees_real_changes(other: dict[str, Any]) -> None:
    assert workflow_fingerprint(other) != workflow_fingerprint(API)


def test_uploaded_file_names_are_ignored() -> None:
    a = {"1": {"class_type": "LoadImage", "inputs": {"image": "ComfyUI_00001_.png"}}}
    b = {"1": {"class_type": "LoadImage", "inputs": {"image": "pasted/image (3).png"}}}
    assert workflow_fingerprint(a) == workflow_fingerprint(b)


def test_object_info_adds_flagged_inputs() -> None:
    a = {"1": {"class_type": "PrimitiveInt", "inputs": {"value": 5}}}
    b = {"1": {"class_type": "PrimitiveInt", "inputs": {"value": 6}}}
    assert workflow_fingerprint(a) != workflow_fingerprint(b)  # "value" is not a seed name...
    assert workflow_fingerprint(a, OBJECT_INFO) == workflow_fingerprint(
        b, OBJECT_INFO
    )  # ...but re-rolled


def test_a_seed_that_is_a_link_is_structure() -> None:
    a = changed(**{"3__seed": ["5", 0]})
    b = changed(**{"3__seed": ["6", 0]})
    assert workflow_fingerprint(a) != workflow_fingerprint(b)


def test_workflow_hash_is_exact_but_ignores_meta_and_order() -> None:
    assert workflow_hash(changed(**{"3__seed": 42})) != workflow_hash(API)
    assert workflow_hash(changed(**{"3___meta": {"title": "x"}})) == workflow_hash(API)
    assert workflow_hash(dict(reversed(list(API.items())))) == workflow_hash(API)
    assert len(workflow_hash(API)) == 64


def test_canonical_json_is_compact_sorted_and_unicode() -> None:
    assert canonical_json({"b": 1.0, "a": ["é", 2.5]}) == '{"a":["é",2.5],"b":1}'
