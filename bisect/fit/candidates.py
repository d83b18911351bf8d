"""Which changes ``oom-bisect fit`` tries for one failure, in the order a user would want them.

The advice every ComfyUI user gets for an out-of-memory workflow is a list: a launch flag
(``--reserve-vram 1.0``, ``--lowvram``, ``--cache-none`` …) or a workflow knob (batch size 1,
a smaller resolution, fewer frames, a tiled VAE decode), "one change at a time". This module
turns that list into concrete changes for *this* failure, and nothing here does I/O:

* the **pool** that ran out picks the flags: a RAM failure gets the flags that lower host
  memory (``--lowvram``/``--novram`` move weights *into* RAM, so they are never offered for a
  RAM failure), a VRAM failure those that lower VRAM, a fragmentation failure
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` first;
* a flag is offered only when the commit's ``cli_args.py`` declares it (``declared``) and the
  device can use it (no VRAM flag on ``--cpu`` or without a GPU); model flags (fp8 weights,
  split cross attention) only when the prompt loads a model;
* a knob is offered only where the prompt exposes it (an integer ``batch_size`` above 1, a
  ``width``/``height`` pair, a frame count, a ``VAEDecode`` when the core has
  ``VAEDecodeTiled``);
* every change carries an **expected cost**, a rough "how much worse is the user's day"
  factor: a flag that costs a few percent of speed comes before one that makes everything
  three times slower, and a change that keeps the output comes before one that changes it
  (batch 1 means running the prompt N times; a smaller resolution is a different picture).

Combinations are built only from singles that were tried and failed (``combinations``), and
only of compatible parts (two VRAM modes, two cache modes or two edits of one input are not).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from oom_sentinel.bisect.measure.flags import ArgSpec, split_flags

__all__ = [
    "ALLOC_CONF",
    "EXPANDABLE",
    "Change",
    "Edit",
    "apply_env",
    "apply_flags",
    "apply_prompt",
    "combinations",
    "combine",
    "flag_candidates",
    "knob_candidates",
    "loads_a_model",
    "order",
]

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"

#: options that exclude each other (argparse mutually exclusive groups in cli_args.py):
#: adding one replaces the user's other one
_VRAM_MODES = frozenset(
    {"--gpu-only", "--highvram", "--normalvram", "--lowvram", "--novram", "--cpu"}
)
_CACHE_MODES = frozenset({"--cache-classic", "--cache-lru", "--cache-none", "--cache-ram"})
_UNET_DTYPES = frozenset(
    {
        "--fp32-unet",
        "--fp64-unet",
        "--bf16-unet",
        "--fp16-unet",
        "--fp8_e4m3fn-unet",
        "--fp8_e5m2-unet",
        "--fp8_e8m0fnu-unet",
    }
)
_ATTENTION = frozenset(
    {
        "--use-split-cross-attention",
        "--use-quad-cross-attention",
        "--use-pytorch-cross-attention",
        "--use-sage-attention",
        "--use-flash-attention",
    }
)
_GROUPS = (_VRAM_MODES, _CACHE_MODES, _UNET_DTYPES, _ATTENTION)

#: inputs that name a model file: a prompt with one loads weights (model flags matter)
_MODEL_INPUTS = ("ckpt_name", "unet_name", "model_name")
#: integer inputs that count video frames
_FRAME_INPUTS = ("length", "frames", "num_frames", "frame_count", "video_frames")
#: node classes whose ``amount`` multiplies the batch
_BATCH_REPEATERS = ("RepeatImageBatch", "RepeatLatentBatch")
#: VAEDecodeTiled's inputs beside samples/vae, ComfyUI v0.8.0's defaults (nodes.py), used when
#: no /object_info says otherwise
TILED_DEFAULTS: Mapping[str, Any] = {
    "tile_size": 512,
    "overlap": 64,
    "temporal_size": 64,
    "temporal_overlap": 8,
}


@dataclass(frozen=True)
class Edit:
    """One input of one node changed; ``input == "class_type"`` swaps the node's class."""

    node: str
    input: str
    old: Any
    new: Any


@dataclass(frozen=True)
class Change:
    """One thing to try (or, with ``parts``, a combination of several)."""

    #: a file-name-safe slug: the changed prompt is written as ``fit-<key>.json``
    key: str
    #: what the user reads: ``--reserve-vram 1.0``, ``batch size 8 → 1``
    label: str
    #: "flag", "env" or "knob" ("combination" for a combination)
    kind: str
    #: expected cost (1.0 = free); the experiment tries the cheapest first
    cost: float
    #: the trade, in one line
    why: str
    flags: tuple[str, ...] = ()
    #: options of the user's flags this change removes (its exclusive group)
    replaces: frozenset[str] = frozenset()
    env: tuple[tuple[str, str], ...] = ()
    edits: tuple[Edit, ...] = ()
    #: the prompt's result differs (fewer images, another size): never applied silently
    changes_output: bool = False
    parts: tuple[str, ...] = ()
    #: runs of the changed prompt that give the baseline's output (batch 8 → 1: 8)
    repeat: int = 1

    @property
    def is_combination(self) -> bool:
        return bool(self.parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "kind": self.kind,
            "cost": self.cost,
            "why": self.why,
            "flags": list(self.flags),
            "env": dict(self.env),
            "edits": [
                {"node": e.node, "input": e.input, "old": e.old, "new": e.new} for e in self.edits
            ],
            "changes_output": self.changes_output,
            "parts": list(self.parts),
            "repeat": self.repeat,
        }


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower() or "change"


def _flag(option: str, *values: str, cost: float, why: str, output: bool = False) -> Change:
    words = (option, *values)
    group = next((g for g in _GROUPS if option in g), frozenset({option}))
    return Change(
        key=_slug(" ".join(words)),
        label=" ".join(words),
        kind="flag",
        cost=cost,
        why=why,
        flags=words,
        replaces=group,
        changes_output=output,
    )


def _user_options(user_flags: Sequence[str], spec: Mapping[str, ArgSpec]) -> set[str]:
    return {u.option for u in split_flags(list(user_flags), spec) if u.option}


def _user_value(user_flags: Sequence[str], option: str, spec: Mapping[str, ArgSpec]) -> str | None:
    for use in split_flags(list(user_flags), spec):
        if use.option == option:
            _, eq, value = use.words[0].partition("=")
            if eq:
                return value
            return use.words[1] if len(use.words) > 1 else None
    return None


def loads_a_model(prompt: Mapping[str, Any]) -> bool:
    """Whether the prompt loads model weights (a loader with ``ckpt_name``/``unet_name``)."""
    for node in prompt.values():
        inputs = node.get("inputs") if isinstance(node, Mapping) else None
        if isinstance(inputs, Mapping) and any(
            isinstance(inputs.get(k), str) for k in _MODEL_INPUTS
        ):
            return True
    return False


def flag_candidates(
    pool: str,
    spec: Mapping[str, ArgSpec],
    *,
    user_flags: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    gpu: bool = True,
    fragmentation: bool = False,
    model: bool = True,
) -> list[Change]:
    """The launch flags (and the allocator variable) worth trying for a ``pool`` failure.

    ``pool`` is "vram" or "ram"; ``spec`` is the commit's parsed ``cli_args.py`` (a flag it
    does not declare is never offered); flags the user already runs with are not offered
    again; ``gpu`` is False on ``--cpu`` or a machine without a GPU (no VRAM flag then).
    """
    have = _user_options(user_flags, spec)
    on_gpu = gpu and "--cpu" not in have
    out: list[Change] = []

    def offer(change: Change, needs: str | None = None) -> None:
        option = needs or change.flags[0]
        if option in spec and option not in have:
            out.append(change)

    if pool == "vram" and on_gpu:
        env = dict(environ or {})
        if EXPANDABLE not in env.get(ALLOC_CONF, ""):
            conf = env.get(ALLOC_CONF, "")
            value = f"{conf},{EXPANDABLE}" if conf else EXPANDABLE
            out.append(
                Change(
                    key="expandable-segments",
                    label=f"{ALLOC_CONF}={EXPANDABLE}",
                    kind="env",
                    cost=1.02 if fragmentation else 1.08,
                    why="lets torch grow its segments instead of leaving gaps "
                    "(the cure for fragmentation); needs the native allocator",
                    # cudaMallocAsync ignores expandable segments: the native allocator only
                    flags=("--disable-cuda-malloc",) if "--disable-cuda-malloc" in spec else (),
                    env=((ALLOC_CONF, value),),
                )
            )
        reserve = 1.0
        current = _user_value(user_flags, "--reserve-vram", spec)
        if current is not None:
            try:
                reserve = float(current) + 1.0
            except ValueError:
                reserve = 1.0
        if "--reserve-vram" in spec:
            out.append(
                Change(
                    key=_slug(f"reserve-vram {reserve:.1f}"),
                    label=f"--reserve-vram {reserve:.1f}",
                    kind="flag",
                    cost=1.05,
                    why="keeps that many GB free for peaks ComfyUI's estimate misses; "
                    "models load a little less",
                    flags=("--reserve-vram", f"{reserve:.1f}"),
                    replaces=frozenset({"--reserve-vram"}),
                )
            )
        offer(
            _flag(
                "--disable-dynamic-vram",
                cost=1.05,
                why="the older, static VRAM management of this ComfyUI",
            )
        )
        offer(
            _flag(
                "--disable-smart-memory",
                cost=1.15,
                why="unloads models after each use instead of keeping them in VRAM",
            )
        )
        if model:
            offer(
                _flag(
                    "--use-split-cross-attention",
                    cost=1.2,
                    why="attention in slices: less VRAM, a little slower",
                )
            )
            offer(
                _flag(
                    "--fp8_e4m3fn-unet",
                    cost=1.25,
                    why="diffusion weights in fp8: half the VRAM, slightly different images",
                    output=True,
                )
            )
        offer(
            _flag(
                "--lowvram",
                cost=1.6,
                why="splits the model between VRAM and RAM: much less VRAM, slower",
            )
        )
        offer(
            _flag(
                "--novram",
                cost=3.0,
                why="keeps weights in RAM and streams them: the least VRAM, far slower",
            )
        )
    elif pool == "ram":
        offer(
            _flag(
                "--disable-pinned-memory",
                cost=1.03,
                why="no page-locked host buffers (they count against RAM and cannot swap)",
            )
        )
        offer(
            _flag(
                "--cache-lru",
                "1",
                cost=1.1,
                why="keeps one node result cached instead of every output of the last prompt",
            )
        )
        offer(
            _flag(
                "--cache-none",
                cost=1.15,
                why="caches no node output: the least RAM, every node runs on every prompt",
            )
        )
        offer(
            _flag(
                "--disable-smart-memory",
                cost=1.2,
                why="unloads models after each use instead of keeping copies around",
            )
        )
    return out


# --------------------------------------------------------------------------- knobs


def _literal_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _literal_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _nodes(prompt: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    out = []
    for node_id in sorted(prompt, key=lambda k: (len(str(k)), str(k))):
        node = prompt[node_id]
        if isinstance(node, Mapping) and isinstance(node.get("inputs"), Mapping):
            out.append((str(node_id), str(node.get("class_type") or "?"), node["inputs"]))
    return out


def _where(edits: Sequence[Edit], classes: Mapping[str, str]) -> str:
    shown = [f"{classes.get(e.node, '?')} #{e.node}" for e in edits]
    unique = list(dict.fromkeys(shown))
    more = f" and {len(unique) - 3} more" if len(unique) > 3 else ""
    return ", ".join(unique[:3]) + more


def _halve_frames(n: int) -> int:
    """Half the frames, keeping a video model's 4k+1 form (81 → 41) where the count has it."""
    if n > 5 and (n - 1) % 4 == 0:
        return max(1, ((n - 1) // 8) * 4 + 1)
    return max(1, n // 2)


def _scaled_side(value: int, factor: float, step: int) -> int:
    step = max(1, step)
    return max(step, int(value * factor) // step * step)


def _input_step(object_info: Mapping[str, Any] | None, cls: str, name: str) -> int | None:
    try:
        spec = object_info[cls]["input"]["required"][name]  # type: ignore[index]
        step = spec[1].get("step")
    except (KeyError, TypeError, IndexError, AttributeError):
        return None
    return int(step) if isinstance(step, int | float) and step >= 1 else None


def knob_candidates(
    prompt: Mapping[str, Any],
    *,
    tiled_vae: Mapping[str, Any] | None = None,
    object_info: Mapping[str, Any] | None = None,
) -> list[Change]:
    """The workflow knobs ``prompt`` exposes, each as one change of every node that has it.

    ``tiled_vae``: the extra inputs of the core's ``VAEDecodeTiled`` with their defaults, or
    None when the core has no such node (then no VAE change is offered).
    """
    nodes = _nodes(prompt)
    classes = {nid: cls for nid, cls, _ in nodes}
    out: list[Change] = []

    if tiled_vae is not None:
        edits = []
        for nid, cls, inputs in nodes:
            if cls != "VAEDecode":
                continue
            edits.append(Edit(nid, "class_type", "VAEDecode", "VAEDecodeTiled"))
            for name, value in tiled_vae.items():
                if name not in inputs:
                    edits.append(Edit(nid, name, None, value))
        if edits:
            out.append(
                Change(
                    key="tiled-vae-decode",
                    label="VAEDecodeTiled in place of VAEDecode",
                    kind="knob",
                    cost=1.3,
                    why="decodes the latent in tiles: much less VRAM at the decode, slower, "
                    "seams are rare",
                    edits=tuple(edits),
                )
            )

    batch = []
    for nid, cls, inputs in nodes:
        value = inputs.get("batch_size")
        if _literal_int(value) and value > 1:
            batch.append(Edit(nid, "batch_size", value, 1))
        amount = inputs.get("amount")
        if cls in _BATCH_REPEATERS and _literal_int(amount) and amount > 1:
            batch.append(Edit(nid, "amount", amount, 1))
    if batch:
        olds = "/".join(str(e.old) for e in batch)
        out.append(
            Change(
                key="batch-1",
                label=f"batch size {olds} → 1 ({_where(batch, classes)})",
                kind="knob",
                cost=2.0,
                why="one image per run: queue the prompt that many times for the same images",
                edits=tuple(batch),
                changes_output=True,
                repeat=max(int(e.old) for e in batch),
            )
        )

    frames = []
    for nid, _cls, inputs in nodes:
        for name in _FRAME_INPUTS:
            value = inputs.get(name)
            if _literal_int(value) and value > 1 and _halve_frames(value) < value:
                frames.append(Edit(nid, name, value, _halve_frames(value)))
    if frames:
        pairs = ", ".join(f"{e.old} → {e.new}" for e in frames[:3])
        out.append(
            Change(
                key="frames-half",
                label=f"frames halved ({pairs}; {_where(frames, classes)})",
                kind="knob",
                cost=2.5,
                why="a shorter clip: render the rest as a second part",
                edits=tuple(frames),
                changes_output=True,
            )
        )

    for factor, cost in ((0.75, 2.2), (0.5, 3.5)):
        edits = []
        for nid, cls, inputs in nodes:
            w, h = inputs.get("width"), inputs.get("height")
            if _literal_int(w) and _literal_int(h) and w > 0 and h > 0:
                for name, value in (("width", w), ("height", h)):
                    step = _input_step(object_info, cls, name) or 8
                    new = _scaled_side(value, factor, step)
                    if new < value:
                        edits.append(Edit(nid, name, value, new))
        if not edits:  # no size of its own: the scale factor decides the resolution
            for nid, _cls, inputs in nodes:
                for name, f in (("scale_by", factor), ("megapixels", factor * factor)):
                    value = inputs.get(name)
                    if _literal_number(value) and value > 0:
                        edits.append(Edit(nid, name, value, round(value * f, 4)))
        if edits:
            out.append(
                Change(
                    key=f"resolution-x{factor:g}",
                    label=f"resolution ×{factor:g} ({_where(edits, classes)})",
                    kind="knob",
                    cost=cost,
                    why="a smaller image: upscale it afterwards in a second pass",
                    edits=tuple(edits),
                    changes_output=True,
                )
            )
    return out


def order(changes: Sequence[Change]) -> list[Change]:
    """Cheapest first; ties keep the order given (flags before knobs of the same cost)."""
    return sorted(changes, key=lambda c: c.cost)


# --------------------------------------------------------------------------- applying


def apply_flags(
    user_flags: Sequence[str], change: Change | None, spec: Mapping[str, ArgSpec]
) -> tuple[str, ...]:
    """The user's flags with ``change``'s added (replacing any of its exclusive group)."""
    if change is None or not change.flags:
        return tuple(user_flags)
    drop = set(change.replaces) | {w for w in change.flags if w.startswith("--")}
    kept: list[str] = []
    for use in split_flags(list(user_flags), spec):
        if use.option not in drop:
            kept.extend(use.words)
    return (*kept, *change.flags)


def apply_env(change: Change | None) -> dict[str, str]:
    return dict(change.env) if change is not None else {}


def apply_prompt(prompt: Mapping[str, Any], change: Change | None) -> dict[str, Any]:
    """A copy of ``prompt`` with ``change``'s edits (the original is never modified)."""
    out = copy.deepcopy(dict(prompt))
    if change is None:
        return out
    for e in change.edits:
        node = out.get(e.node)
        if not isinstance(node, dict):
            continue
        if e.input == "class_type":
            node["class_type"] = e.new
        else:
            node.setdefault("inputs", {})[e.input] = e.new
    return out


# --------------------------------------------------------------------------- combinations


def _flag_groups(change: Change) -> set[str]:
    opts = {w for w in change.flags if w.startswith("--") and w != "--disable-cuda-malloc"}
    out = set(opts)
    for g in _GROUPS:
        if opts & g:
            out |= {f"group:{sorted(g)[0]}"}
    return out


def combine(a: Change, b: Change) -> Change | None:
    """Both changes at once, or None when they cannot go together."""
    if _flag_groups(a) & _flag_groups(b):
        return None
    if {k for k, _ in a.env} & {k for k, _ in b.env}:
        return None
    if {(e.node, e.input) for e in a.edits} & {(e.node, e.input) for e in b.edits}:
        return None
    flags = list(a.flags)
    flags += [w for w in b.flags if not (w == "--disable-cuda-malloc" and w in flags)]
    parts = (*(a.parts or (a.key,)), *(b.parts or (b.key,)))
    return Change(
        key="+".join(parts),
        label=f"{a.label} + {b.label}",
        kind="combination",
        cost=round(a.cost * b.cost, 4),
        why="no single change fitted; together: " + "; ".join((a.why, b.why)),
        flags=tuple(flags),
        replaces=a.replaces | b.replaces,
        env=a.env + b.env,
        edits=a.edits + b.edits,
        changes_output=a.changes_output or b.changes_output,
        parts=parts,
        repeat=a.repeat * b.repeat,
    )


def combinations(failed: Sequence[Change]) -> list[Change]:
    """Pairs of singles that each failed, cheapest pair first; a flag with a knob before two
    flags or two knobs (they lower memory in different places, so they add up best)."""
    pairs: list[tuple[int, float, int, Change]] = []
    n = 0
    for i, a in enumerate(failed):
        for b in failed[i + 1 :]:
            both = combine(a, b)
            if both is None:
                continue
            mixed = (a.kind == "knob") != (b.kind == "knob")
            pairs.append((0 if mixed else 1, both.cost, n, both))
            n += 1
    return [c for *_, c in sorted(pairs, key=lambda t: t[:3])]
