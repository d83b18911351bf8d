"""Stable identities for API prompts, so one workflow can be recognised across runs.

Two different questions need two different hashes:

- ``workflow_hash`` answers "is this exactly the prompt we replayed before?" It keys the
  bisect's outcome cache, so every value counts (a new seed is a new measurement).
- ``workflow_fingerprint`` answers "is this the same workflow the user ran yesterday?" It keys run
  history (a suspected regression is an OOM of a workflow that used to succeed), so it ignores
  what changes on every queue without changing the work: seeds (``control_after_generate``
  re-rolls them after each run), output filename prefixes, the names of uploaded input files,
  and ``_meta`` (titles, ignored by the backend).

Both hash a canonical JSON text (sorted keys, no whitespace, integral floats written as ints
because ComfyUI's validation coerces ``8`` and ``8.0`` alike). The daemon owns this module
because it records runs; ``oom_sentinel.bisect.workflow.load`` re-exports both functions.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "FILE_INPUTS",
    "SEED_INPUT_NAMES",
    "canonical_json",
    "workflow_fingerprint",
    "workflow_hash",
]

#: Inputs re-rolled by the frontend on every queue even when object_info is not at hand
#: (the frontend adds a control widget to INTs with these names, see comfyui-facts §6.4).
SEED_INPUT_NAMES = frozenset({"seed", "noise_seed"})

#: Input names that hold output file name prefixes (SaveImage, SaveLatent, SaveVideo, ...).
_PREFIX_INPUT_NAMES = frozenset({"filename_prefix"})

#: Per class, inputs that name an uploaded input file; used when object_info is unknown.
#: With object_info, any combo carrying an ``*_upload`` option counts as well.
FILE_INPUTS: Mapping[str, frozenset[str]] = {
    "LoadImage": frozenset({"image"}),
    "LoadImageMask": frozenset({"image"}),
    "LoadImageOutput": frozenset({"image"}),
    "LoadAudio": frozenset({"audio"}),
    "LoadVideo": frozenset({"file"}),
}

_IGNORED = "<ignored>"


def canonical_json(value: Any) -> str:
    """The one text both hashes are taken over: sorted keys, compact, integral floats as ints."""
    return json.dumps(_normalise(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def workflow_hash(api_prompt: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the exact prompt, ``_meta`` left out: same hash, same replay."""
    stripped = {
        str(node_id): _without_meta(node) if isinstance(node, Mapping) else node
        for node_id, node in api_prompt.items()
    }
    return _sha256(canonical_json(stripped))


def workflow_fingerprint(
    api_prompt: Mapping[str, Any], object_info: Mapping[str, Any] | None = None
) -> str:
    """SHA-256 (hex) of the prompt with per-run noise replaced by a placeholder.

    Ignored (the key is kept, its literal value replaced, so removing an input still changes
    the fingerprint): inputs named ``seed``/``noise_seed``; inputs whose object_info options
    say ``control_after_generate``; ``filename_prefix``; uploaded-file inputs (``LoadImage``'s
    ``image`` and, with object_info, any combo with an ``*_upload`` option); and ``_meta``.
    Links (``[node_id, slot]``) are structure and always count.
    """
    out: dict[str, Any] = {}
    for node_id, node in api_prompt.items():
        if not isinstance(node, Mapping):
            out[str(node_id)] = node
            continue
        class_type = node.get("class_type")
        inputs = node.get("inputs")
        if not isinstance(inputs, Mapping):
            out[str(node_id)] = _without_meta(node)
            continue
        ignored = _ignored_inputs(class_type, object_info)
        new_inputs = {
            name: (_IGNORED if (name in ignored or _is_noise_name(name)) and not _is_link(v) else v)
            for name, v in inputs.items()
        }
        copy = _without_meta(node)
        copy["inputs"] = new_inputs
        out[str(node_id)] = copy
    return _sha256(canonical_json(out))


def _is_noise_name(name: str) -> bool:
    return name in SEED_INPUT_NAMES or name in _PREFIX_INPUT_NAMES


def _ignored_inputs(class_type: Any, object_info: Mapping[str, Any] | None) -> frozenset[str]:
    names: set[str] = (
        set(FILE_INPUTS.get(class_type, frozenset())) if isinstance(class_type, str) else set()
    )
    info = object_info.get(class_type) if object_info and isinstance(class_type, str) else None
    if isinstance(info, Mapping):
        sections = info.get("input")
        if isinstance(sections, Mapping):
            for section in ("required", "optional"):
                specs = sections.get(section)
                if not isinstance(specs, Mapping):
                    continue
                for name, spec in specs.items():
                    options = spec[1] if isinstance(spec, list | tuple) and len(spec) > 1 else None
                    if not isinstance(options, Mapping):
                        continue
                    if options.get("control_after_generate"):
                        names.add(name)
                    if any(k.endswith("_upload") and options.get(k) for k in options):
                        names.add(name)
    return frozenset(names)


def _is_link(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str | int)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    )


def _without_meta(node: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k != "_meta"}


def _normalise(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    return value


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
