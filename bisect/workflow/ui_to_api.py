"""Convert a ComfyUI UI workflow (what the editor saves) into the API prompt the server runs.

The bisect replays prompts, but users often have only the UI form: a saved ``workflow.json``,
or a PNG written without the ``prompt`` chunk. The UI form does not name its inputs: widget
values are a positional list whose meaning depends on the node definitions of the ComfyUI
that will run it, so the conversion takes that server's ``/object_info`` and mirrors what the
frontend's ``graphToPrompt`` does (comfyui-facts §6.4; ideas from ComfyUI_frontend's
``executionUtil.ts``, ``ExecutableNodeDTO``, ``groupNode.ts``, ``SubgraphNode.ts``):

- subgraphs are expanded recursively (inner ids ``outer:inner``; links from the input pseudo
  node ``-10`` resolve to what feeds the instance, links into ``-20`` are the instance's
  outputs; promoted widgets on the instance override inner values), legacy group nodes
  (``workflow>NAME`` / ``workflow/NAME``) likewise;
- frontend-only nodes (Reroute, PrimitiveNode, notes, ...) and muted (mode 2) or bypassed
  (mode 4) nodes are not emitted; links are resolved through them;
- widget values are matched to inputs in object_info order, skipping the frontend's extra
  values (``control_after_generate`` companions, a combo's filter box, the upload button).

Pure: no I/O. Problems that still allow a prompt become ``warnings``; only a document that is
not a UI workflow at all raises ``InputError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oom_sentinel.daemon.core.errors import InputError

__all__ = [
    "CONTROL_VALUES",
    "VIRTUAL_TYPES",
    "ConversionResult",
    "convert",
    "is_ui_workflow",
]

#: Frontend-only node types: they never reach the server. Reroute-like ones pass their input
#: slot through; PrimitiveNode copies its value into the widget it feeds; the rest are inert.
#: (Pack types listed are registered in JavaScript by rgthree, KJNodes and similar packs.)
VIRTUAL_TYPES = frozenset(
    {
        "Reroute",
        "PrimitiveNode",
        "Note",
        "MarkdownNote",
        "SetNode",
        "GetNode",
        "Reroute (rgthree)",
        "Fast Groups Muter (rgthree)",
        "Fast Groups Bypasser (rgthree)",
        "Fast Muter (rgthree)",
        "Fast Bypasser (rgthree)",
        "Fast Actions Button (rgthree)",
        "Mute / Bypass Repeater (rgthree)",
        "Mute / Bypass Relay (rgthree)",
        "Node Collector (rgthree)",
        "Bookmark (rgthree)",
        "Label (rgthree)",
        "Note Plus (mtb)",
    }
)

#: Values of the frontend's ``control_after_generate`` companion widget.
CONTROL_VALUES = frozenset({"fixed", "increment", "decrement", "randomize", "increment-wrap"})

_MUTED = 2  # LiteGraph LGraphEventMode.NEVER
_BYPASSED = 4  # LGraphEventMode.BYPASS
_SUBGRAPH_INPUT_ID = "-10"
_SUBGRAPH_OUTPUT_ID = "-20"
_MAX_DEPTH = 32
_WIDGET_TYPES = frozenset({"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO", "COMFY_DYNAMICCOMBO_V3"})
_PASS_THROUGH_TYPES = frozenset({"Reroute", "Reroute (rgthree)"})
_BACKEND_MARKERS = ("Node name for S&R", "cnr_id", "aux_id")
_UPLOAD_MARKERS = frozenset({"", "image", "video", "audio", "file", "upload", "animated_image"})
_MISSING: Any = object()


@dataclass(frozen=True)
class ConversionResult:
    """The API prompt (``{id: {class_type, inputs, _meta}}``) and what needed guessing."""

    prompt: dict[str, dict[str, Any]]
    warnings: list[str] = field(default_factory=list)


def is_ui_workflow(doc: Any) -> bool:
    """True for a UI workflow document (schema 0.4 or 1): a ``nodes`` list at the top."""
    return isinstance(doc, Mapping) and isinstance(doc.get("nodes"), list)


def convert(ui_workflow: Mapping[str, Any], object_info: Mapping[str, Any]) -> ConversionResult:
    """Convert ``ui_workflow`` using the node definitions in ``object_info``.

    ``object_info`` must come from the ComfyUI (commit and custom nodes) that will execute the
    prompt: input order and widget layout change between versions (comfyui-facts §6.4.1).
    """
    if not is_ui_workflow(ui_workflow):
        raise InputError("UI workflow: no 'nodes' list at the top level")
    if not isinstance(object_info, Mapping):
        raise InputError("object_info: not a JSON object")
    return _Converter(ui_workflow, object_info).run()


# --------------------------------------------------------------------------------------------
# Graph model


@dataclass(frozen=True)
class _Link:
    origin_id: str
    origin_slot: int
    target_id: str
    target_slot: int
    type: Any


@dataclass(frozen=True)
class _Source:
    """A resolved link: output ``slot`` of the node with execution id ``exec_id``."""

    exec_id: str
    slot: int


@dataclass(frozen=True)
class _Value:
    """A resolved link that turned into a widget value (PrimitiveNode, promoted widget)."""

    value: Any


@dataclass
class _Scope:
    """One graph level: the root graph, or one instance of a subgraph or group node."""

    nodes: dict[str, Mapping[str, Any]]
    order: list[str]
    links: dict[str, _Link]
    path: tuple[str, ...] = ()
    parent: _Scope | None = None
    instance: Mapping[str, Any] | None = None
    #: subgraph-style interface: input names in slot order and, per output slot, the inner link
    input_names: list[str] = field(default_factory=list)
    output_links: dict[int, str] = field(default_factory=dict)
    #: instance widget values for subgraph inputs (by input name)
    promoted: dict[str, Any] = field(default_factory=dict)
    #: per inner node id, widget overrides from the instance (proxy widgets, group widgets)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: instance inputs are matched by index (legacy group nodes) rather than by name
    match_inputs_by_index: bool = False
    label: str = "workflow"
    children: dict[str, _Scope | None] = field(default_factory=dict)

    def exec_id(self, local_id: str) -> str:
        return ":".join((*self.path, local_id))


# --------------------------------------------------------------------------------------------
# Parsing helpers


def _node_id(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int | str) else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _parse_links(raw: Any, warnings: list[str], where: str) -> dict[str, _Link]:
    """Links in either form: 0.4 arrays ``[id, from, from_slot, to, to_slot, type]`` or
    schema-1 objects ``{id, origin_id, origin_slot, target_id, target_slot, type}``."""
    out: dict[str, _Link] = {}
    if raw is None:
        return out
    items: Iterable[Any] = raw.values() if isinstance(raw, Mapping) else raw
    if not isinstance(items, Iterable) or isinstance(items, str | bytes):
        warnings.append(f"{where}: 'links' is not a list; links ignored")
        return out
    for item in items:
        if isinstance(item, Sequence) and not isinstance(item, str) and len(item) >= 5:
            lid, oid, oslot, tid, tslot = item[0], item[1], item[2], item[3], item[4]
            ltype = item[5] if len(item) > 5 else None
        elif isinstance(item, Mapping):
            lid, oid, oslot = item.get("id"), item.get("origin_id"), item.get("origin_slot")
            tid, tslot, ltype = item.get("target_id"), item.get("target_slot"), item.get("type")
        else:
            if item is not None:
                warnings.append(f"{where}: a link is neither an array nor an object; ignored")
            continue
        key, origin, target = _node_id(lid), _node_id(oid), _node_id(tid)
        o_slot, t_slot = _int(oslot), _int(tslot)
        if key is None or origin is None or target is None or o_slot is None or t_slot is None:
            warnings.append(f"{where}: link {lid!r} is malformed; ignored")
            continue
        out[key] = _Link(origin, o_slot, target, t_slot, ltype)
    return out


def _parse_nodes(raw: Any, warnings: list[str], where: str) -> tuple[dict[str, Any], list[str]]:
    nodes: dict[str, Mapping[str, Any]] = {}
    order: list[str] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, Mapping):
            warnings.append(f"{where}: a node is not an object; ignored")
            continue
        nid = _node_id(item.get("id"))
        if nid is None:
            warnings.append(f"{where}: a node has no usable id; ignored")
            continue
        if nid in nodes:
            warnings.append(f"{where}: node id {nid} appears twice; the later one ignored")
            continue
        nodes[nid] = item
        order.append(nid)
    return nodes, order


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _inputs_of(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    raw = node.get("inputs")
    return [i if isinstance(i, Mapping) else {} for i in raw] if isinstance(raw, list) else []


def _mode(node: Mapping[str, Any]) -> int:
    mode = _int(node.get("mode"))
    return mode if mode is not None else 0


def _type(node: Mapping[str, Any]) -> str:
    t = node.get("type")
    return t if isinstance(t, str) else ""


def _wrap(value: Any) -> Any:
    """A literal list would read as a link: the API wants it boxed (comfyui-facts §1.2)."""
    return {"__value__": list(value)} if isinstance(value, list | tuple) else value


# --------------------------------------------------------------------------------------------
# Node definitions (object_info) → widget layout


@dataclass(frozen=True)
class _InputSpec:
    name: str
    type: Any
    options: Mapping[str, Any]
    required: bool

    @property
    def is_combo(self) -> bool:
        return isinstance(self.type, list) or self.type in ("COMBO", "COMFY_DYNAMICCOMBO_V3")

    @property
    def is_widget(self) -> bool:
        return isinstance(self.type, list) or (
            isinstance(self.type, str) and self.type.upper() in _WIDGET_TYPES
        )

    @property
    def force_input(self) -> bool:
        return bool(self.options.get("forceInput"))

    @property
    def has_control(self) -> bool:
        # control = spec.control_after_generate ?? (INT named seed/noise_seed): the frontend's
        # rule (useIntWidget.ts); an explicit false wins over the name.
        if "control_after_generate" in self.options:
            return bool(self.options.get("control_after_generate"))
        return self.type == "INT" and self.name in ("seed", "noise_seed")

    @property
    def has_upload(self) -> bool:
        return self.is_combo and any(
            k.endswith("_upload") and bool(v) for k, v in self.options.items()
        )

    def default(self) -> Any:
        if "default" in self.options:
            return self.options["default"]
        if isinstance(self.type, list):
            return self.type[0] if self.type else _MISSING
        if self.is_combo:
            choices = self.options.get("options")
            if isinstance(choices, list) and choices:
                first = choices[0]
                return first.get("key", _MISSING) if isinstance(first, Mapping) else first
            return _MISSING
        if self.type in ("INT", "FLOAT"):
            return self.options.get("min", 0)
        if self.type == "STRING":
            return ""
        if self.type == "BOOLEAN":
            return False
        return _MISSING


def _input_specs(info: Mapping[str, Any]) -> list[_InputSpec]:
    """Required then optional inputs, in ``input_order`` (or the dict order on old servers)."""
    sections = info.get("input")
    if not isinstance(sections, Mapping):
        return []
    order = info.get("input_order")
    specs: list[_InputSpec] = []
    for section in ("required", "optional"):
        entries = sections.get(section)
        if not isinstance(entries, Mapping):
            continue
        names: list[str] = list(entries)
        listed = order.get(section) if isinstance(order, Mapping) else None
        if isinstance(listed, list):
            names = [n for n in listed if n in entries] + [n for n in entries if n not in listed]
        for name in names:
            raw = entries[name]
            if isinstance(raw, str):
                raw = [raw]
            if not isinstance(raw, list | tuple) or not raw:
                continue
            options = raw[1] if len(raw) > 1 and isinstance(raw[1], Mapping) else {}
            specs.append(_InputSpec(str(name), raw[0], options, section == "required"))
    return specs


@dataclass(frozen=True)
class _Slot:
    name: str
    kind: str  # "value" | "control" | "filter" | "upload"
    spec: _InputSpec | None = None


def _layout(specs: Sequence[_InputSpec], *, legacy_force_input: bool = False) -> list[_Slot]:
    """Where each widget value sits in ``widgets_values``, as the frontend builds widgets.

    One value per widget input; after an input with ``control_after_generate`` the control
    value (and, for a combo, the filter box); one upload-button value after the required
    widgets when a required combo has an ``*_upload`` flag (the upload extension appends an
    ``upload`` input to ``required``). ``legacy_force_input``: frontends before 2025 also kept
    a (converted) widget for every ``forceInput`` widget input.
    """
    slots: list[_Slot] = []
    upload_after_required = False
    for i, spec in enumerate(specs):
        if spec.is_widget and (not spec.force_input or legacy_force_input):
            slots.append(_Slot(spec.name, "value", spec))
            if spec.has_control:
                slots.append(_Slot(spec.name, "control", spec))
                if spec.is_combo:
                    slots.append(_Slot(spec.name, "filter", spec))
        upload_after_required = upload_after_required or (spec.required and spec.has_upload)
        last_required = spec.required and (i + 1 == len(specs) or not specs[i + 1].required)
        if last_required and upload_after_required:
            slots.append(_Slot("upload", "upload"))
    return slots


def _is_control_value(value: Any) -> bool:
    """A ``control_after_generate`` companion value: a mode name, or (frontends of early 2023)
    the boolean of the "random seed after every gen" toggle; ``None`` is a sparse hole."""
    return (
        value is None
        or isinstance(value, bool)
        or (isinstance(value, str) and value in CONTROL_VALUES)
    )


def _assign(slots: Sequence[_Slot], values: Sequence[Any]) -> tuple[list[Any], int]:
    """Walk ``values`` along ``slots``: the value of each ``value`` slot (``_MISSING`` where the
    list ran out, and for companion slots) and how many values were used.

    Companion values are consumed only when they look like one (a control mode, a string for
    the upload button), so workflows saved without them still line up.
    """
    out: list[Any] = []
    i = 0
    control_taken = False
    for k, slot in enumerate(slots):
        here = values[i] if i < len(values) else _MISSING
        out.append(_MISSING)
        if slot.kind == "value":
            out[k] = here
            i += 1
        elif slot.kind == "control":
            control_taken = _is_control_value(here)
            if control_taken:
                i += 1
        elif slot.kind == "filter":
            if control_taken and here is not _MISSING:
                i += 1
        elif slot.kind == "upload" and here is not _MISSING:
            more_values_follow = any(s.kind == "value" for s in slots[k + 1 :])
            looks_like_marker = here is None or (
                isinstance(here, str) and here.lower() in _UPLOAD_MARKERS
            )
            if looks_like_marker or not more_values_follow:
                i += 1
    return out, min(i, len(values))


def _widget_values(
    info: Mapping[str, Any] | None,
    node: Mapping[str, Any],
    overrides: Mapping[str, Any],
    warnings: list[str],
    label: str,
) -> dict[str, Any]:
    """Input name → widget value for one executable node (before links override them)."""
    specs = _input_specs(info) if info else []
    raw = node.get("widgets_values")
    named = node.get("widgets_values_named")
    found: dict[str, tuple[_InputSpec | None, Any]] = {}
    if isinstance(raw, Mapping):
        for spec in specs:
            if spec.is_widget and not spec.force_input:
                found[spec.name] = (spec, raw.get(spec.name, _MISSING))
    else:
        values = list(raw) if isinstance(raw, list) else []
        slots = _layout(specs)
        legacy = _layout(specs, legacy_force_input=True)
        if len(legacy) != len(slots) and len(values) == len(legacy):
            slots = legacy  # saved before forceInput stopped taking a widget position
        assigned, used = _assign(slots, values)
        for slot, value in zip(slots, assigned, strict=True):
            if slot.kind == "value":
                found[slot.name] = (slot.spec, value)
        extra = values[used:]
        if any(isinstance(v, Mapping) for v in extra):
            warnings.append(
                f"{label}: {len(extra)} widget value(s) not described by object_info "
                "(frontend-only widgets) were left out"
            )
        found = {
            name: pair
            for name, pair in found.items()
            if pair[0] is not None and not (pair[0].force_input and slots is legacy)
        }
    if isinstance(named, Mapping):
        for name, value in named.items():
            if name in found:
                found[name] = (found[name][0], value)
    out: dict[str, Any] = {}
    for name, (found_spec, value) in found.items():
        if name in overrides:
            value = overrides[name]
        if value is _MISSING or value is None:
            default = found_spec.default() if found_spec is not None else _MISSING
            if default is _MISSING:
                warnings.append(f"{label}: no value for widget '{name}' and no default; left out")
                continue
            warnings.append(f"{label}: no value for widget '{name}'; used the default {default!r}")
            value = default
        out[name] = _wrap(value)
    return out


# --------------------------------------------------------------------------------------------
# The converter


class _Converter:
    def __init__(self, workflow: Mapping[str, Any], object_info: Mapping[str, Any]) -> None:
        self.workflow = workflow
        self.info = object_info
        self.warnings: list[str] = []
        self.prompt: dict[str, dict[str, Any]] = {}
        self.subgraphs: dict[str, Mapping[str, Any]] = {}
        self._collect_definitions(workflow, 0)
        extra = workflow.get("extra")
        groups = extra.get("groupNodes") if isinstance(extra, Mapping) else None
        self.group_defs: Mapping[str, Any] = groups if isinstance(groups, Mapping) else {}
        self._unknown_warned: set[str] = set()

    # -- definitions -------------------------------------------------------------------------

    def _collect_definitions(self, holder: Mapping[str, Any], depth: int) -> None:
        defs = holder.get("definitions")
        subgraphs = defs.get("subgraphs") if isinstance(defs, Mapping) else None
        if not isinstance(subgraphs, list) or depth > _MAX_DEPTH:
            return
        for sub in subgraphs:
            if isinstance(sub, Mapping) and isinstance(sub.get("id"), str):
                self.subgraphs.setdefault(sub["id"], sub)
                self._collect_definitions(sub, depth + 1)

    # -- classification ----------------------------------------------------------------------

    def _kind(self, node: Mapping[str, Any]) -> str:
        t = _type(node)
        if t in self.subgraphs:
            return "subgraph"
        if t.startswith(("workflow>", "workflow/")):
            return "group"
        if t in self.info:
            return "real"
        if t in VIRTUAL_TYPES:
            return "virtual"
        props = node.get("properties")
        marked = isinstance(props, Mapping) and any(props.get(m) for m in _BACKEND_MARKERS)
        linked = any(i.get("link") is not None for i in _inputs_of(node)) or any(
            isinstance(o, Mapping) and o.get("links") for o in _list(node.get("outputs"))
        )
        if marked or linked:
            if t not in self._unknown_warned:
                self._unknown_warned.add(t)
                self.warnings.append(
                    f"node type {t!r} is not in object_info; kept as is "
                    "(the server will reject the prompt if it cannot run it)"
                )
            return "unknown"
        if t not in self._unknown_warned:
            self._unknown_warned.add(t)
            self.warnings.append(
                f"node type {t!r} is not in object_info and has no links or backend markers; "
                "treated as frontend-only"
            )
        return "virtual"

    # -- walk --------------------------------------------------------------------------------

    def run(self) -> ConversionResult:
        nodes, order = _parse_nodes(self.workflow.get("nodes"), self.warnings, "workflow")
        root = _Scope(
            nodes, order, _parse_links(self.workflow.get("links"), self.warnings, "workflow")
        )
        self._walk(root)
        self._drop_dangling_links()
        return ConversionResult(self.prompt, self.warnings)

    def _walk(self, scope: _Scope) -> None:
        for local_id in scope.order:
            node = scope.nodes[local_id]
            kind = self._kind(node)
            if kind in ("subgraph", "group"):
                if _mode(node) in (_MUTED, _BYPASSED):
                    continue  # the whole instance is off: none of its inner nodes run
                child = self._child(scope, local_id)
                if child is not None:
                    self._walk(child)
            elif kind in ("real", "unknown") and _mode(node) not in (_MUTED, _BYPASSED):
                self._emit(scope, local_id, node, kind)

    def _child(self, scope: _Scope, local_id: str) -> _Scope | None:
        """The scope of the subgraph or group instance ``local_id`` (built once)."""
        if local_id in scope.children:
            return scope.children[local_id]
        node = scope.nodes[local_id]
        label = f"{scope.label} node {scope.exec_id(local_id)}"
        child: _Scope | None = None
        ancestors: set[str] = set()
        outer: _Scope | None = scope
        while outer is not None and outer.instance is not None:
            ancestors.add(_type(outer.instance))
            outer = outer.parent
        if _type(node) in ancestors:
            self.warnings.append(f"{label}: subgraph {_type(node)} contains itself; skipped")
        elif len(scope.path) >= _MAX_DEPTH:
            self.warnings.append(f"{label}: subgraphs nested deeper than {_MAX_DEPTH}; skipped")
        elif _type(node) in self.subgraphs:
            child = self._subgraph_scope(scope, local_id, node, self.subgraphs[_type(node)])
        else:
            child = self._group_scope(scope, local_id, node, label)
        scope.children[local_id] = child
        return child

    # -- subgraphs ---------------------------------------------------------------------------

    def _subgraph_scope(
        self, scope: _Scope, local_id: str, node: Mapping[str, Any], definition: Mapping[str, Any]
    ) -> _Scope:
        label = (
            f"subgraph {definition.get('name') or _type(node)!s} (node {scope.exec_id(local_id)})"
        )
        nodes, order = _parse_nodes(definition.get("nodes"), self.warnings, label)
        links = _parse_links(definition.get("links"), self.warnings, label)
        inputs = [i for i in _list(definition.get("inputs")) if isinstance(i, Mapping)]
        outputs = [o for o in _list(definition.get("outputs")) if isinstance(o, Mapping)]
        child = _Scope(
            nodes,
            order,
            links,
            path=(*scope.path, local_id),
            parent=scope,
            instance=node,
            input_names=[str(i.get("name", "")) for i in inputs],
            label=label,
        )
        for slot, output in enumerate(outputs):
            ids = output.get("linkIds")
            first = _node_id(ids[0]) if isinstance(ids, list) and ids else None
            if first is None:  # fall back to any link that ends at this output slot
                first = next(
                    (
                        k
                        for k, ln in links.items()
                        if ln.target_id == _SUBGRAPH_OUTPUT_ID and ln.target_slot == slot
                    ),
                    None,
                )
            if first is not None:
                child.output_links[slot] = first
        self._apply_instance_widgets(child, node, inputs, links)
        return child

    def _apply_instance_widgets(
        self,
        child: _Scope,
        node: Mapping[str, Any],
        inputs: list[Mapping[str, Any]],
        links: Mapping[str, _Link],
    ) -> None:
        """Map the instance's ``widgets_values`` onto promoted inputs and proxied widgets.

        With ``properties.proxyWidgets`` (frontend ≥ 1.28) value k belongs to proxy k:
        ``["-1", name]`` is the subgraph input ``name``, ``[node_id, widget]`` an inner widget.
        Without it, one value per subgraph input that feeds a widget, in input order (old
        instances may carry a control value after a seed; those are skipped).
        """
        raw = node.get("widgets_values")
        values = list(raw) if isinstance(raw, list) else []
        named = raw if isinstance(raw, Mapping) else node.get("widgets_values_named")
        props = node.get("properties")
        proxies = props.get("proxyWidgets") if isinstance(props, Mapping) else None
        if isinstance(proxies, list) and proxies:
            for k, proxy in enumerate(proxies):
                if not (isinstance(proxy, list | tuple) and len(proxy) >= 2) or k >= len(values):
                    continue
                value = values[k]
                if value is None:
                    continue
                inner, widget = _node_id(proxy[0]), str(proxy[1])
                if inner is None:
                    continue
                if inner == "-1":
                    child.promoted[widget] = value
                else:
                    child.overrides.setdefault(inner, {})[widget] = value
        else:
            promoted = [
                str(i.get("name", ""))
                for slot, i in enumerate(inputs)
                if self._feeds_widget(child, slot, links)
            ]
            vi = 0
            for name in promoted:
                if vi >= len(values):
                    break
                if values[vi] is not None:
                    child.promoted[name] = values[vi]
                vi += 1
                if (
                    len(values) > len(promoted)
                    and vi < len(values)
                    and _is_control_value(values[vi])
                ):
                    vi += 1
        if isinstance(named, Mapping):
            for name, value in named.items():
                if name in child.input_names and value is not None:
                    child.promoted[str(name)] = value

    def _feeds_widget(self, child: _Scope, slot: int, links: Mapping[str, _Link]) -> bool:
        """Whether subgraph input ``slot`` is connected to a widget input inside."""
        for link_id, link in links.items():
            if link.origin_id != _SUBGRAPH_INPUT_ID or link.origin_slot != slot:
                continue
            target = child.nodes.get(link.target_id)
            if target is None:
                continue
            entries = _inputs_of(target)
            entry = next((e for e in entries if _node_id(e.get("link")) == link_id), None)
            if entry is None and 0 <= link.target_slot < len(entries):
                entry = entries[link.target_slot]
            if entry is None:
                continue
            if isinstance(entry.get("widget"), Mapping) or _type(target) in self.subgraphs:
                return True  # a widget socket, or a nested instance's (maybe promoted) input
        return False

    # -- legacy group nodes ------------------------------------------------------------------

    def _group_scope(
        self, scope: _Scope, local_id: str, node: Mapping[str, Any], label: str
    ) -> _Scope | None:
        t = _type(node)
        name = t.split(">", 1)[1] if ">" in t else t.split("/", 1)[1]
        definition = self.group_defs.get(name)
        if not isinstance(definition, Mapping):
            self.warnings.append(
                f"{label}: group node {t!r} has no definition in extra.groupNodes; skipped"
            )
            return None
        if scope.path:
            self.warnings.append(
                f"{label}: group nodes inside subgraphs are not supported by ComfyUI; skipped"
            )
            return None
        return _GroupBuilder(self, scope, local_id, node, definition, name).build()

    # -- emitting ----------------------------------------------------------------------------

    def _emit(self, scope: _Scope, local_id: str, node: Mapping[str, Any], kind: str) -> None:
        exec_id = scope.exec_id(local_id)
        t = _type(node)
        info = self.info.get(t) if kind == "real" else None
        info = info if isinstance(info, Mapping) else None
        label = f"node {exec_id} ({t})"
        inputs = _widget_values(info, node, scope.overrides.get(local_id, {}), self.warnings, label)
        for entry in _inputs_of(node):
            link_id = _node_id(entry.get("link"))
            name = entry.get("name")
            if link_id is None or not isinstance(name, str):
                continue
            resolved = self._resolve_link(scope, link_id, entry.get("type"), set(), label)
            if isinstance(resolved, _Source):
                inputs[name] = [resolved.exec_id, resolved.slot]
            elif isinstance(resolved, _Value):
                inputs[name] = _wrap(resolved.value)
        title = node.get("title")
        if not isinstance(title, str) or not title:
            display = info.get("display_name") if info else None
            title = display if isinstance(display, str) and display else t
        self.prompt[exec_id] = {"inputs": inputs, "class_type": t, "_meta": {"title": title}}

    def _drop_dangling_links(self) -> None:
        """A link whose source is not in the prompt (muted, skipped) is removed, as the
        frontend does; the server then reports a missing required input, if it was one."""
        for exec_id, entry in self.prompt.items():
            inputs = entry["inputs"]
            for name in list(inputs):
                value = inputs[name]
                if isinstance(value, list) and len(value) == 2 and value[0] not in self.prompt:
                    del inputs[name]
                    self.warnings.append(
                        f"node {exec_id} ({entry['class_type']}): input '{name}' comes from node "
                        f"{value[0]}, which does not run (muted or not executable); input dropped"
                    )

    # -- resolution --------------------------------------------------------------------------

    def _resolve_link(
        self, scope: _Scope, link_id: str, want_type: Any, visited: set[tuple[int, str]], label: str
    ) -> _Source | _Value | None:
        link = scope.links.get(link_id)
        if link is None:
            self.warnings.append(
                f"{label}: link {link_id} does not exist in {scope.label}; ignored"
            )
            return None
        if link.origin_id == _SUBGRAPH_INPUT_ID:
            return self._resolve_scope_input(scope, link.origin_slot, want_type, visited, label)
        return self._resolve_output(
            scope, link.origin_id, link.origin_slot, want_type, visited, label
        )

    def _resolve_scope_input(
        self, scope: _Scope, slot: int, want_type: Any, visited: set[tuple[int, str]], label: str
    ) -> _Source | _Value | None:
        """What feeds input ``slot`` of the instance that owns ``scope``."""
        if scope.parent is None or scope.instance is None:
            self.warnings.append(f"{label}: a link starts at the subgraph input outside a subgraph")
            return None
        name = scope.input_names[slot] if 0 <= slot < len(scope.input_names) else None
        entries = _inputs_of(scope.instance)
        entry: Mapping[str, Any] | None = None
        if scope.match_inputs_by_index:
            entry = entries[slot] if 0 <= slot < len(entries) else None
        else:
            entry = next((e for e in entries if e.get("name") == name), None)
            if (
                entry is None
                and len(entries) == len(scope.input_names)
                and 0 <= slot < len(entries)
            ):
                entry = entries[slot]
        link_id = _node_id(entry.get("link")) if entry is not None else None
        if link_id is not None:
            return self._resolve_link(scope.parent, link_id, want_type, visited, label)
        if name is not None and name in scope.promoted:
            return _Value(scope.promoted[name])
        return None

    def _resolve_output(
        self,
        scope: _Scope,
        local_id: str,
        slot: int,
        want_type: Any,
        visited: set[tuple[int, str]],
        label: str,
    ) -> _Source | _Value | None:
        key = (id(scope), f"{local_id}[O]{slot}")
        if key in visited:
            self.warnings.append(
                f"{label}: circular link through node {scope.exec_id(local_id)}; ignored"
            )
            return None
        visited.add(key)
        node = scope.nodes.get(local_id)
        if node is None:
            self.warnings.append(
                f"{label}: link from missing node {scope.exec_id(local_id)}; ignored"
            )
            return None
        mode = _mode(node)
        if mode == _BYPASSED:
            return self._resolve_bypass(scope, node, slot, want_type, visited, label)
        kind = self._kind(node)
        if kind in ("subgraph", "group"):
            if mode == _MUTED:
                return _Source(scope.exec_id(local_id), slot)  # dropped at the end
            child = self._child(scope, local_id)
            if child is None:
                return None
            inner_link = child.output_links.get(slot)
            if inner_link is None:
                return None
            return self._resolve_link(child, inner_link, want_type, visited, label)
        if kind == "virtual":
            return self._resolve_virtual(scope, local_id, node, slot, want_type, visited, label)
        return _Source(scope.exec_id(local_id), slot)

    def _resolve_bypass(
        self,
        scope: _Scope,
        node: Mapping[str, Any],
        slot: int,
        want_type: Any,
        visited: set[tuple[int, str]],
        label: str,
    ) -> _Source | _Value | None:
        """A bypassed node passes through its input of the requested type: the same slot
        index first, then the first input in order (ExecutableNodeDTO.resolveOutput)."""
        entries = _inputs_of(node)
        for i in [slot, *range(len(entries))]:
            if 0 <= i < len(entries) and entries[i].get("type") == want_type:
                link_id = _node_id(entries[i].get("link"))
                if link_id is None:
                    return None
                return self._resolve_link(scope, link_id, want_type, visited, label)
        return None

    def _resolve_virtual(
        self,
        scope: _Scope,
        local_id: str,
        node: Mapping[str, Any],
        slot: int,
        want_type: Any,
        visited: set[tuple[int, str]],
        label: str,
    ) -> _Source | _Value | None:
        t = _type(node)
        if t == "PrimitiveNode":
            override = scope.overrides.get(local_id, {})
            if "value" in override:
                return _Value(override["value"])
            values = node.get("widgets_values")
            if isinstance(values, list) and values:
                return _Value(values[0])
            if isinstance(values, Mapping) and "value" in values:
                return _Value(values["value"])
            self.warnings.append(f"{label}: PrimitiveNode {scope.exec_id(local_id)} has no value")
            return None
        if t == "GetNode":
            return self._resolve_get_node(scope, node, want_type, visited, label)
        entries = _inputs_of(node)
        if 0 <= slot < len(entries):
            link_id = _node_id(entries[slot].get("link"))
            if link_id is not None:
                return self._resolve_link(scope, link_id, want_type, visited, label)
        return None

    def _resolve_get_node(
        self,
        scope: _Scope,
        node: Mapping[str, Any],
        want_type: Any,
        visited: set[tuple[int, str]],
        label: str,
    ) -> _Source | _Value | None:
        """KJNodes' GetNode reads the SetNode with the same name in the same graph."""
        values = node.get("widgets_values")
        key = values[0] if isinstance(values, list) and values else None
        for other_id in scope.order:
            other = scope.nodes[other_id]
            other_values = other.get("widgets_values")
            if (
                _type(other) == "SetNode"
                and isinstance(other_values, list)
                and other_values
                and other_values[0] == key
            ):
                entries = _inputs_of(other)
                link_id = _node_id(entries[0].get("link")) if entries else None
                if link_id is not None:
                    return self._resolve_link(scope, link_id, want_type, visited, label)
        self.warnings.append(f"{label}: no SetNode named {key!r} for GetNode; input left unset")
        return None


# --------------------------------------------------------------------------------------------
# Legacy group nodes


class _GroupBuilder:
    """Turn one legacy group-node instance into a subgraph-like scope.

    The definition (``extra.groupNodes[NAME]``) holds the inner nodes (their index is their
    id: execution ids are ``<group id>:<index>``), inner links as
    ``[from_index, from_slot, to_index, to_slot, original_id, type]`` and ``external``
    ``[index, slot, type]`` for outputs also used outside. The instance's inputs are the inner
    inputs not linked inside, in node order (converted widgets after all others); its outputs
    are the inner outputs not consumed inside (or marked external); its ``widgets_values`` hold
    every inner widget in node order (GroupNodeConfig in the frontend's groupNode.ts).
    """

    def __init__(
        self,
        conv: _Converter,
        scope: _Scope,
        local_id: str,
        node: Mapping[str, Any],
        definition: Mapping[str, Any],
        name: str,
    ) -> None:
        self.conv = conv
        self.scope = scope
        self.local_id = local_id
        self.node = node
        self.definition = definition
        self.name = name
        self.label = f"group node {name!r} (node {scope.exec_id(local_id)})"

    def build(self) -> _Scope:
        raw_nodes = self.definition.get("nodes")
        inner = (
            [n if isinstance(n, Mapping) else {} for n in raw_nodes]
            if isinstance(raw_nodes, list)
            else []
        )
        links_to: dict[tuple[int, int], tuple[int, int, Any]] = {}
        linked_from: set[int] = set()
        raw_links = self.definition.get("links")
        for item in raw_links if isinstance(raw_links, list) else []:
            if not (isinstance(item, list) and len(item) >= 4):
                continue
            o, os_, tgt, tslot = (_int(x) for x in item[:4])
            if o is None or os_ is None or tgt is None or tslot is None:
                continue  # a link from outside the copied selection
            links_to[(tgt, tslot)] = (o, os_, item[5] if len(item) > 5 else None)
            linked_from.add(o)
        used_from = {(o, os_) for (o, os_, _t) in links_to.values()}
        external: set[tuple[int, int]] = set()
        for item in _list(self.definition.get("external")):
            if isinstance(item, list) and len(item) >= 2:
                a, b = _int(item[0]), _int(item[1])
                if a is not None and b is not None:
                    external.add((a, b))
        config = self.definition.get("config")
        config = config if isinstance(config, Mapping) else {}

        links: dict[str, _Link] = {}
        nodes: dict[str, Mapping[str, Any]] = {}
        entries_of: dict[int, list[dict[str, Any]]] = {}
        for idx, raw in enumerate(inner):
            entries = [dict(e) for e in _inputs_of(raw)]
            for entry in entries:
                entry["link"] = None
            entries_of[idx] = entries
            nodes[str(idx)] = {**raw, "id": idx, "inputs": entries}
        for (tgt, tslot), (o, os_, ltype) in links_to.items():
            key = f"g{tgt}:{tslot}"
            links[key] = _Link(str(o), os_, str(tgt), tslot, ltype)
            if tgt in entries_of and 0 <= tslot < len(entries_of[tgt]):
                entries_of[tgt][tslot]["link"] = key

        # Instance inputs, in order: each node's plain inputs not linked inside, then (after
        # all nodes) converted widgets not linked inside. Instance widgets: each node's
        # widgets in definition order, converted widgets after all nodes.
        inputs: list[tuple[int, int]] = []
        widgets: list[tuple[int, _Slot]] = []
        late_inputs: list[tuple[int, int]] = []
        late_widgets: list[tuple[int, _Slot]] = []
        for idx, raw in enumerate(inner):
            t = _type(raw)
            entries = entries_of[idx]
            if t == "PrimitiveNode":
                if idx in linked_from:
                    combo = any(o == idx and lt == "COMBO" for (o, _s, lt) in links_to.values())
                    spec = _InputSpec("value", "COMBO" if combo else "INT", {}, True)
                    widgets.append((idx, _Slot("value", "value", spec)))
                    widgets.append((idx, _Slot("value", "control", spec)))
                    if combo:
                        widgets.append((idx, _Slot("value", "filter", spec)))
                continue
            if t == "Reroute":
                internal = (
                    (idx, 0) in links_to and (idx, 0) in used_from and (idx, 0) not in external
                )
                if not internal and (idx, 0) not in links_to and entries:
                    inputs.append((idx, 0))
                continue
            info = self.conv.info.get(t)
            if not isinstance(info, Mapping):
                continue
            specs = _input_specs(info)
            converted = {
                str(e.get("name"))
                for e in entries
                if isinstance(e.get("widget"), Mapping) and e["widget"].get("name") == e.get("name")
            }
            node_cfg = config.get(str(idx))
            input_cfg = node_cfg.get("input") if isinstance(node_cfg, Mapping) else None
            # With widget sockets (frontend >= 1.16) every saved widget has an input entry; a
            # widget without one was added to the node after the group was made: it takes no
            # position and gets its default.
            sockets = bool(converted)
            names = {str(e.get("name")) for e in entries}
            plain_widgets = [
                s
                for s in specs
                if s.name not in converted and not (sockets and s.name not in names)
            ]
            widgets.extend((idx, slot) for slot in _layout(plain_widgets))
            for spec in specs:
                if spec.is_widget and not spec.force_input:
                    continue
                pos = _entry_index(entries, spec.name)
                if pos is None or (idx, pos) in links_to:
                    continue
                cfg = input_cfg.get(spec.name) if isinstance(input_cfg, Mapping) else None
                if isinstance(cfg, Mapping) and cfg.get("visible") is False:
                    continue
                inputs.append((idx, pos))
            by_name = {s.name: s for s in specs}
            for pos, entry in enumerate(entries):
                late = by_name.get(str(entry.get("name")))
                if late is None or late.name not in converted or (idx, pos) in links_to:
                    continue
                late_inputs.append((idx, pos))
                late_widgets.extend((idx, slot) for slot in _layout([late]))
        inputs.extend(late_inputs)
        widgets.extend(late_widgets)

        child = _Scope(
            nodes,
            [str(i) for i in range(len(inner))],
            links,
            path=(*self.scope.path, self.local_id),
            parent=self.scope,
            instance=self.node,
            match_inputs_by_index=True,
            label=self.label,
        )
        for k, (idx, pos) in enumerate(inputs):
            key = f"in{k}"
            entries_of[idx][pos]["link"] = key
            child.input_names.append(str(entries_of[idx][pos].get("name")))
            links[key] = _Link(_SUBGRAPH_INPUT_ID, k, str(idx), pos, None)

        # Instance outputs: every inner output not consumed inside (or also used outside).
        out_slot = 0
        for idx, raw in enumerate(inner):
            t = _type(raw)
            if t == "PrimitiveNode":
                count = 1 if idx in linked_from else 0
            elif t == "Reroute":
                internal = (
                    (idx, 0) in links_to and (idx, 0) in used_from and (idx, 0) not in external
                )
                count = 0 if internal else 1
            else:
                info = self.conv.info.get(t)
                outs = info.get("output") if isinstance(info, Mapping) else None
                count = len(outs) if isinstance(outs, list) else len(_list(raw.get("outputs")))
            node_cfg = config.get(str(idx))
            output_cfg = node_cfg.get("output") if isinstance(node_cfg, Mapping) else None
            for s in range(count):
                cfg = output_cfg.get(str(s)) if isinstance(output_cfg, Mapping) else None
                hidden = (idx, s) in used_from and (idx, s) not in external
                visible = (
                    cfg["visible"] if isinstance(cfg, Mapping) and "visible" in cfg else not hidden
                )
                if not visible:
                    continue
                key = f"out{out_slot}"
                links[key] = _Link(str(idx), s, _SUBGRAPH_OUTPUT_ID, out_slot, None)
                child.output_links[out_slot] = key
                out_slot += 1

        # Instance widget values become per-inner-node overrides.
        raw_values = self.node.get("widgets_values")
        values = list(raw_values) if isinstance(raw_values, list) else []
        assigned, _used = _assign([slot for _i, slot in widgets], values)
        for (idx, slot), value in zip(widgets, assigned, strict=True):
            if slot.kind == "value" and value is not _MISSING and value is not None:
                child.overrides.setdefault(str(idx), {})[slot.name] = value
        return child


def _entry_index(entries: Sequence[Mapping[str, Any]], name: str) -> int | None:
    return next((j for j, e in enumerate(entries) if e.get("name") == name), None)
