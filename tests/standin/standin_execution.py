"""Validation, the prompt queue, the cache and the executor of the stand-in ComfyUI.

What clients observe is copied from ComfyUI v0.8.0's behaviour (comfyui-facts.md 1.2-1.4, 1.10,
2.2, 11): the 400 bodies of ``POST /prompt``, the 5-element queue items with the sensitive 6th
element stripped, history entries written before the final ``executing``/``node: null``, the
message order (``execution_start``, ``execution_cached``, ``progress_state``, ``executing``, ...,
``execution_success``/``execution_error``), who receives which message, the classic cache (an
identical re-post executes nothing), and the log lines of a failing node. The code is our own.
"""

from __future__ import annotations

import copy
import hashlib
import heapq
import itertools
import json
import logging
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import execution
import standin_api as api
import standin_memory as mem

MAXIMUM_HISTORY_SIZE = 10000
SENSITIVE_EXTRA_DATA_KEYS = ("auth_token_comfy_org", "api_key_comfy_org")
OOM_TIPS = (
    "This error means you ran out of memory on your GPU.\n\nTIPS: If the workflow worked before "
    "you might have accidentally set the batch_size to a large number."
)

NODE_CLASS_MAPPINGS: dict[str, type] = {}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {}


class Server(Protocol):
    client_id: str | None
    last_node_id: str | None
    last_prompt_id: str | None

    def send_sync(self, event: str | int, data: Any, sid: str | None = None) -> None: ...

    def queue_updated(self) -> None: ...


# ---- validation ------------------------------------------------------------------------------
def full_type_name(klass: type) -> str:
    module = klass.__module__
    if module == "builtins":
        return klass.__qualname__
    return f"{module}.{klass.__qualname__}"


def _is_link(value: Any) -> bool:
    return isinstance(value, list)


def _types_match(received: str, wanted: Any) -> bool:
    if not isinstance(wanted, str):
        return True  # a combo fed from a link: checked at run time, as ComfyUI does
    if received == "*" or wanted == "*":
        return True
    return bool(set(received.split(",")) & set(wanted.split(",")))


def _error(kind: str, message: str, details: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "message": message, "details": details, "extra_info": extra}


def validate_inputs(
    prompt: dict[str, Any], node_id: str, validated: dict[str, tuple[bool, list[Any], str]]
) -> tuple[bool, list[Any], str]:
    if node_id in validated:
        return validated[node_id]
    node = prompt[node_id]
    inputs = node.get("inputs", {}) or {}
    cls = NODE_CLASS_MAPPINGS[node["class_type"]]
    spec = cls.INPUT_TYPES()
    required = spec.get("required", {}) or {}
    optional = spec.get("optional", {}) or {}
    errors: list[dict[str, Any]] = []
    valid = True
    validate_fn = getattr(cls, "VALIDATE_INPUTS", None)

    for name in required:
        if name not in inputs:
            errors.append(
                _error(
                    "required_input_missing",
                    "Required input is missing",
                    name,
                    {"input_name": name},
                )
            )

    for name, info in [*required.items(), *optional.items()]:
        if name not in inputs:
            continue
        val = inputs[name]
        type_input = info[0]
        options = info[1] if len(info) > 1 and isinstance(info[1], dict) else {}
        if _is_link(val):
            if len(val) != 2:
                errors.append(
                    _error(
                        "bad_linked_input",
                        "Bad linked input, must be a length-2 list of [node_id, slot_index]",
                        name,
                        {"input_name": name, "input_config": info, "received_value": val},
                    )
                )
                continue
            upstream = str(val[0])
            if upstream not in prompt:
                errors.append(
                    _error(
                        "bad_linked_input",
                        "Bad linked input, must be a length-2 list of [node_id, slot_index]",
                        name,
                        {"input_name": name, "input_config": info, "received_value": val},
                    )
                )
                continue
            returns = NODE_CLASS_MAPPINGS[prompt[upstream]["class_type"]].RETURN_TYPES
            slot = int(val[1])
            received = returns[slot] if 0 <= slot < len(returns) else "*"
            if not _types_match(received, type_input):
                details = f"{name}, received_type({received}) mismatch input_type({type_input})"
                errors.append(
                    _error(
                        "return_type_mismatch",
                        "Return type mismatch between linked nodes",
                        details,
                        {
                            "input_name": name,
                            "input_config": info,
                            "received_type": received,
                            "linked_node": val,
                        },
                    )
                )
                continue
            try:
                ok, _reasons, _ = validate_inputs(prompt, upstream, validated)
                if not ok:
                    valid = False
            except Exception as ex:
                _typ, _, tb = sys.exc_info()
                valid = False
                reasons = [
                    _error(
                        "exception_during_inner_validation",
                        "Exception when validating inner node",
                        str(ex),
                        {
                            "input_name": name,
                            "input_config": info,
                            "exception_message": str(ex),
                            "exception_type": full_type_name(type(ex)),
                            "traceback": traceback.format_tb(tb),
                            "linked_node": val,
                        },
                    )
                ]
                validated[upstream] = (False, reasons, upstream)
            continue

        if isinstance(val, dict) and "__value__" in val:
            val = val["__value__"]
        try:
            if type_input == "INT":
                val = int(val)
            elif type_input == "FLOAT":
                val = float(val)
            elif type_input == "STRING":
                val = str(val)
            elif type_input == "BOOLEAN":
                val = bool(val)
        except Exception as ex:
            errors.append(
                _error(
                    "invalid_input_type",
                    f"Failed to convert an input value to a {type_input} value",
                    f"{name}, {val}, {ex}",
                    {
                        "input_name": name,
                        "input_config": info,
                        "received_value": val,
                        "exception_message": str(ex),
                    },
                )
            )
            continue
        if "min" in options and val < options["min"]:
            errors.append(
                _error(
                    "value_smaller_than_min",
                    f"Value {val} smaller than min of {options['min']}",
                    name,
                    {"input_name": name, "input_config": info, "received_value": val},
                )
            )
            continue
        if "max" in options and val > options["max"]:
            errors.append(
                _error(
                    "value_bigger_than_max",
                    f"Value {val} bigger than max of {options['max']}",
                    name,
                    {"input_name": name, "input_config": info, "received_value": val},
                )
            )
            continue
        if validate_fn is not None:
            try:
                result = validate_fn(**{name: val})
            except TypeError:
                result = True
            if result is not True:
                details = name if result is False else f"{name} - {result}"
                errors.append(
                    _error(
                        "custom_validation_failed",
                        "Custom validation failed for node",
                        details,
                        {"input_name": name, "input_config": info, "received_value": val},
                    )
                )
            continue
        if isinstance(type_input, list) and val not in type_input:
            list_info = (
                f"(list of length {len(type_input)})" if len(type_input) > 20 else str(type_input)
            )
            errors.append(
                _error(
                    "value_not_in_list",
                    "Value not in list",
                    f"{name}: '{val}' not in {list_info}",
                    {
                        "input_name": name,
                        "input_config": None if len(type_input) > 20 else info,
                        "received_value": val,
                    },
                )
            )

    result = (False, errors, node_id) if errors or not valid else (True, [], node_id)
    validated[node_id] = result
    return result


def validate_prompt(
    prompt: Any, partial_targets: list[str] | None = None
) -> tuple[bool, dict[str, Any] | None, list[str], dict[str, Any]]:
    """(valid, error, outputs to execute, node_errors), as ``execution.validate_prompt``."""
    if not isinstance(prompt, dict):
        return (
            False,
            _error(
                "invalid_prompt",
                "Cannot execute because a node is missing the class_type property.",
                "Node ID '#'",
                {},
            ),
            [],
            {},
        )
    outputs: list[str] = []
    for node_id, node in prompt.items():
        if not isinstance(node, dict) or "class_type" not in node:
            return (
                False,
                _error(
                    "invalid_prompt",
                    "Cannot execute because a node is missing the class_type property.",
                    f"Node ID '#{node_id}'",
                    {},
                ),
                [],
                {},
            )
        cls = NODE_CLASS_MAPPINGS.get(node["class_type"])
        if cls is None:
            return (
                False,
                _error(
                    "invalid_prompt",
                    f"Cannot execute because node {node['class_type']} does not exist.",
                    f"Node ID '#{node_id}'",
                    {},
                ),
                [],
                {},
            )
        if getattr(cls, "OUTPUT_NODE", False) is True and (
            partial_targets is None or node_id in partial_targets
        ):
            outputs.append(node_id)
    if not outputs:
        return (False, _error("prompt_no_outputs", "Prompt has no outputs", "", {}), [], {})

    good: list[str] = []
    failures: list[tuple[str, list[Any]]] = []
    node_errors: dict[str, Any] = {}
    validated: dict[str, tuple[bool, list[Any], str]] = {}
    for out in sorted(outputs, key=_node_sort_key):
        try:
            ok, reasons, _ = validate_inputs(prompt, out, validated)
        except Exception as ex:
            _typ, _, tb = sys.exc_info()
            ok = False
            reasons = [
                _error(
                    "exception_during_validation",
                    "Exception when validating node",
                    str(ex),
                    {
                        "exception_type": full_type_name(type(ex)),
                        "traceback": traceback.format_tb(tb),
                    },
                )
            ]
            validated[out] = (False, reasons, out)
        if ok:
            good.append(out)
            continue
        logging.error(f"Failed to validate prompt for output {out}:")
        if reasons:
            logging.error("* (prompt):")
            for reason in reasons:
                logging.error(f"  - {reason['message']}: {reason['details']}")
        failures.append((out, reasons))
        for nid, (nok, nreasons, _) in validated.items():
            if nok is not True and nreasons:
                if nid not in node_errors:
                    class_type = prompt[nid]["class_type"]
                    node_errors[nid] = {
                        "errors": nreasons,
                        "dependent_outputs": [],
                        "class_type": class_type,
                    }
                    logging.error(f"* {class_type} {nid}:")
                    for reason in nreasons:
                        logging.error(f"  - {reason['message']}: {reason['details']}")
                node_errors[nid]["dependent_outputs"].append(out)
        logging.error("Output will be ignored")

    if not good:
        lines = [f"{e['message']}: {e['details']}" for _, errs in failures for e in errs]
        return (
            False,
            _error(
                "prompt_outputs_failed_validation",
                "Prompt outputs failed validation",
                "\n".join(lines),
                {},
            ),
            [],
            node_errors,
        )
    return (True, None, good, node_errors)


def _node_sort_key(node_id: str) -> tuple[int, str]:
    try:
        return (0, f"{int(node_id):020d}")
    except ValueError:
        return (1, node_id)


# ---- queue -----------------------------------------------------------------------------------
@dataclass
class ExecutionStatus:
    status_str: str
    completed: bool
    messages: list[tuple[str, dict[str, Any]]]


class PromptQueue:
    """A heap of pending items, the running item, the in-memory history and the /free flags."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.mutex = threading.RLock()
        self.not_empty = threading.Condition(self.mutex)
        self.task_counter = 0
        self._tie = itertools.count()
        self.queue: list[tuple[float, int, tuple[Any, ...]]] = []
        self.currently_running: dict[int, tuple[Any, ...]] = {}
        self.history: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.flags: dict[str, Any] = {}

    def put(self, item: tuple[Any, ...]) -> None:
        with self.mutex:
            heapq.heappush(self.queue, (item[0], next(self._tie), item))
            self.server.queue_updated()
            self.not_empty.notify()

    def get(self, timeout: float | None = None) -> tuple[tuple[Any, ...], int] | None:
        with self.not_empty:
            while not self.queue:
                self.not_empty.wait(timeout=timeout)
                if timeout is not None and not self.queue:
                    return None
            _, _, item = heapq.heappop(self.queue)
            i = self.task_counter
            self.currently_running[i] = copy.deepcopy(item)
            self.task_counter += 1
            self.server.queue_updated()
            return item, i

    def task_done(
        self, item_id: int, history_result: dict[str, Any], status: ExecutionStatus | None
    ) -> None:
        with self.mutex:
            item = self.currently_running.pop(item_id)
            if len(self.history) > MAXIMUM_HISTORY_SIZE:
                self.history.popitem(last=False)
            entry: dict[str, Any] = {
                "prompt": list(item[:5]),
                "outputs": {},
                "status": None
                if status is None
                else {
                    "status_str": status.status_str,
                    "completed": status.completed,
                    "messages": [list(m) for m in status.messages],
                },
            }
            entry.update(history_result)
            self.history[item[1]] = entry
            self.server.queue_updated()

    def get_current_queue(self) -> tuple[list[list[Any]], list[list[Any]]]:
        with self.mutex:
            running = [list(x[:5]) for x in self.currently_running.values()]
            pending = [list(x[2][:5]) for x in self.queue]
            return copy.deepcopy(running), copy.deepcopy(pending)

    def running_prompt_ids(self) -> list[str]:
        with self.mutex:
            return [x[1] for x in self.currently_running.values()]

    def get_tasks_remaining(self) -> int:
        with self.mutex:
            return len(self.queue) + len(self.currently_running)

    def wipe_queue(self) -> None:
        with self.mutex:
            self.queue = []
            self.server.queue_updated()

    def delete_queue_item(self, predicate: Callable[[tuple[Any, ...]], bool]) -> bool:
        with self.mutex:
            for i, entry in enumerate(self.queue):
                if predicate(entry[2]):
                    if len(self.queue) == 1:
                        self.wipe_queue()  # a status broadcast of its own, then one more
                    else:
                        self.queue.pop(i)
                        heapq.heapify(self.queue)
                    self.server.queue_updated()
                    return True
        return False

    def get_history(
        self, prompt_id: str | None = None, max_items: int | None = None, offset: int = -1
    ) -> dict[str, Any]:
        with self.mutex:
            if prompt_id is None:
                out: dict[str, Any] = {}
                if offset < 0 and max_items is not None:
                    offset = len(self.history) - max_items
                for i, (key, value) in enumerate(self.history.items()):
                    if i >= offset:
                        out[key] = value
                        if max_items is not None and len(out) >= max_items:
                            break
                return copy.deepcopy(out)
            if prompt_id in self.history:
                return {prompt_id: copy.deepcopy(self.history[prompt_id])}
            return {}

    def wipe_history(self) -> None:
        with self.mutex:
            self.history.clear()

    def delete_history_item(self, prompt_id: str) -> None:
        with self.mutex:
            self.history.pop(prompt_id, None)

    def set_flag(self, name: str, data: Any) -> None:
        with self.mutex:
            self.flags[name] = data
            self.not_empty.notify()

    def get_flags(self) -> dict[str, Any]:
        with self.mutex:
            flags, self.flags = self.flags, {}
            return flags


# ---- cache -----------------------------------------------------------------------------------
@dataclass
class CacheEntry:
    outputs: tuple[Any, ...]
    ui: dict[str, Any] | None


class OutputCache:
    """Node results keyed by input signature. ``classic`` keeps the last prompt's results,
    ``lru`` the last N results across prompts, ``none`` nothing."""

    def __init__(self, mode: str, lru_size: int = 0) -> None:
        self.mode = mode
        self.lru_size = lru_size
        self.entries: OrderedDict[str, CacheEntry] = OrderedDict()

    def set_prompt(self, signatures: dict[str, str]) -> None:
        if self.mode == "classic":
            keep = set(signatures.values())
            for key in [k for k in self.entries if k not in keep]:
                del self.entries[key]

    def get(self, signature: str) -> CacheEntry | None:
        if self.mode == "none":
            return None
        entry = self.entries.get(signature)
        if entry is not None:
            self.entries.move_to_end(signature)
        return entry

    def set(self, signature: str, entry: CacheEntry) -> None:
        if self.mode == "none":
            return
        self.entries[signature] = entry
        self.entries.move_to_end(signature)
        if self.mode == "lru":
            while len(self.entries) > self.lru_size:
                self.entries.popitem(last=False)

    def reset(self) -> None:
        self.entries.clear()


def signatures_of(prompt: dict[str, Any]) -> dict[str, str]:
    """A hash per node of its class, literal inputs and upstream signatures."""
    memo: dict[str, str] = {}

    def sig(node_id: str, stack: frozenset[str]) -> str:
        if node_id in memo:
            return memo[node_id]
        node = prompt[node_id]
        parts: list[Any] = [node["class_type"]]
        for name in sorted(node.get("inputs", {}) or {}):
            value = node["inputs"][name]
            if (
                _is_link(value)
                and len(value) == 2
                and str(value[0]) in prompt
                and str(value[0]) not in stack
            ):
                parts.append([name, "link", sig(str(value[0]), stack | {node_id}), value[1]])
            else:
                parts.append([name, value])
        digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
        memo[node_id] = digest
        return digest

    return {node_id: sig(node_id, frozenset()) for node_id in prompt}


# ---- executor --------------------------------------------------------------------------------
def format_value(value: Any) -> Any:
    if value is None or isinstance(value, int | float | bool | str):
        return value
    return str(value)


@dataclass
class _Progress:
    prompt_id: str
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class _Run:
    """What one prompt's nodes share while it runs (ComfyUI's ``execution_list`` slot)."""

    prompt: dict[str, Any]
    signatures: dict[str, str]
    outputs: dict[str, tuple[Any, ...]]
    ui_outputs: dict[str, dict[str, Any]]


class PromptExecutor:
    def __init__(self, server: Server, cache_mode: str, lru_size: int = 0) -> None:
        self.server = server
        self.cache = OutputCache(cache_mode, lru_size)
        self.status_messages: list[tuple[str, dict[str, Any]]] = []
        self.success = True
        self.history_result: dict[str, Any] = {}
        self._progress = _Progress("")

    def reset(self) -> None:
        self.cache.reset()

    def add_message(self, event: str, data: dict[str, Any], broadcast: bool) -> None:
        data = {**data, "timestamp": int(time.time() * 1000)}
        self.status_messages.append((event, data))
        if self.server.client_id is not None or broadcast:
            self.server.send_sync(event, data, self.server.client_id)

    # -- progress_state ----------------------------------------------------------------------
    def _send_progress_state(self) -> None:
        pid = self._progress.prompt_id
        nodes = {
            nid: {
                "value": st["value"],
                "max": st["max"],
                "state": st["state"],
                "node_id": nid,
                "prompt_id": pid,
                "display_node_id": nid,
                "parent_node_id": None,
                "real_node_id": nid,
            }
            for nid, st in self._progress.nodes.items()
            if st["state"] != "pending"
        }
        self.server.send_sync(
            "progress_state", {"prompt_id": pid, "nodes": nodes}, self.server.client_id
        )

    def _progress_set(self, node_id: str, state: str, value: float, maximum: float) -> None:
        self._progress.nodes[node_id] = {"state": state, "value": value, "max": maximum}
        self._send_progress_state()

    def _finish_progress(self, node_id: str) -> None:
        entry = self._progress.nodes.get(node_id, {"max": 1.0})
        self._progress_set(node_id, "finished", entry["max"], entry["max"])

    # -- the run -----------------------------------------------------------------------------
    def execute(
        self,
        prompt: dict[str, Any],
        prompt_id: str,
        extra_data: dict[str, Any],
        execute_outputs: list[str],
    ) -> None:
        api.RUNTIME.interrupted.clear()
        self.server.client_id = extra_data.get("client_id")
        self.server.last_prompt_id = prompt_id
        self.status_messages = []
        self.success = True
        self.add_message("execution_start", {"prompt_id": prompt_id}, broadcast=False)

        self._progress = _Progress(
            prompt_id, {nid: {"state": "pending", "value": 0, "max": 1} for nid in prompt}
        )
        signatures = signatures_of(prompt)
        self.cache.set_prompt(signatures)
        cached_nodes = [nid for nid in prompt if self.cache.get(signatures[nid]) is not None]
        # What the output cache holds keys for: every node of the prompt (none with
        # --cache-none), not only the cached ones -- as a real v0.8.0 reports it.
        current_outputs = [] if self.cache.mode == "none" else list(prompt)
        self.add_message(
            "execution_cached", {"nodes": cached_nodes, "prompt_id": prompt_id}, broadcast=False
        )

        outputs: dict[str, tuple[Any, ...]] = {}
        ui_outputs: dict[str, dict[str, Any]] = {}
        executed: list[str] = []
        dynprompt = execution.DynamicPrompt(prompt)
        run = _Run(prompt, signatures, outputs, ui_outputs)
        for node_id in self._execution_order(prompt, execute_outputs, signatures):
            # through the module attribute, looked up per node, as ComfyUI's executor does:
            # the replay bootstrap wraps execution.execute (bisect/measure/bootstrap.py)
            failure = execution.execute(
                self.server, dynprompt, self, node_id, extra_data, executed, prompt_id, run, {}
            )
            if failure is not None:
                error, ex = failure
                self.success = False
                self._handle_error(prompt_id, prompt, current_outputs, executed, error, ex)
                break
        else:
            self.add_message("execution_success", {"prompt_id": prompt_id}, broadcast=False)

        self.history_result = {
            "outputs": {nid: ui["output"] for nid, ui in ui_outputs.items()},
            "meta": {nid: ui["meta"] for nid, ui in ui_outputs.items()},
        }
        self.server.last_node_id = None
        if api.RUNTIME.disable_smart_memory:
            api.unload_all_models()

    def run_node(
        self,
        node_id: str,
        prompt_id: str,
        extra_data: dict[str, Any],
        executed: list[str],
        run: _Run,
    ) -> tuple[dict[str, Any], BaseException] | None:
        """One node, called through ``execution.execute`` (the hook point)."""
        return self._execute_node(
            run.prompt,
            node_id,
            prompt_id,
            extra_data,
            run.signatures,
            run.outputs,
            run.ui_outputs,
            executed,
        )

    def _execution_order(
        self, prompt: dict[str, Any], execute_outputs: list[str], signatures: dict[str, str]
    ) -> list[str]:
        order: list[str] = []
        seen: set[str] = set()

        def visit(node_id: str, root: bool) -> None:
            if node_id in seen:
                return
            if not root and self.cache.get(signatures[node_id]) is not None:
                return
            seen.add(node_id)
            for value in (prompt[node_id].get("inputs", {}) or {}).values():
                if _is_link(value) and len(value) == 2 and str(value[0]) in prompt:
                    visit(str(value[0]), False)
            order.append(node_id)

        for out in sorted(execute_outputs, key=_node_sort_key):
            visit(out, True)
        return order

    def _execute_node(
        self,
        prompt: dict[str, Any],
        node_id: str,
        prompt_id: str,
        extra_data: dict[str, Any],
        signatures: dict[str, str],
        outputs: dict[str, tuple[Any, ...]],
        ui_outputs: dict[str, dict[str, Any]],
        executed: list[str],
    ) -> tuple[dict[str, Any], BaseException] | None:
        server = self.server
        node = prompt[node_id]
        class_type = node["class_type"]
        cls = NODE_CLASS_MAPPINGS[class_type]
        meta = {
            "node_id": node_id,
            "display_node": node_id,
            "parent_node": None,
            "real_node_id": node_id,
        }

        cached = self.cache.get(signatures[node_id])
        if cached is not None:
            if server.client_id is not None:
                cached_output = cached.ui.get("output") if cached.ui else None
                server.send_sync(
                    "executed",
                    {
                        "node": node_id,
                        "display_node": node_id,
                        "output": cached_output,
                        "prompt_id": prompt_id,
                    },
                    server.client_id,
                )
            if cached.ui is not None:
                ui_outputs[node_id] = cached.ui
            outputs[node_id] = cached.outputs
            self._finish_progress(node_id)
            return None

        input_data: dict[str, Any] | None = None
        try:
            self._progress_set(node_id, "running", 0.0, 1.0)
            input_data = self._input_data(prompt, node_id, cls, extra_data, signatures, outputs)
            if server.client_id is not None:
                server.last_node_id = node_id
                server.send_sync(
                    "executing",
                    {"node": node_id, "display_node": node_id, "prompt_id": prompt_id},
                    server.client_id,
                )

            def hook(value: float, total: float) -> None:
                self._progress_set(node_id, "running", value, total)
                server.send_sync(
                    "progress",
                    {"value": value, "max": total, "prompt_id": prompt_id, "node": node_id},
                    server.client_id,
                )
                if api.RUNTIME.preview:
                    server.send_sync(1, PREVIEW_PNG, server.client_id)

            api.RUNTIME.progress_hook = hook
            try:
                api.check_interrupt()
                result = getattr(cls(), cls.FUNCTION)(**input_data)
            finally:
                api.RUNTIME.progress_hook = None
            ui: dict[str, Any] | None = None
            if isinstance(result, dict):
                ui = result.get("ui")
                result = tuple(result.get("result", ()))
            result = tuple(result)
            outputs[node_id] = result
            entry_ui = {"meta": meta, "output": ui} if ui else None
            if entry_ui is not None:
                ui_outputs[node_id] = entry_ui
                if server.client_id is not None:
                    server.send_sync(
                        "executed",
                        {
                            "node": node_id,
                            "display_node": node_id,
                            "output": ui,
                            "prompt_id": prompt_id,
                        },
                        server.client_id,
                    )
            self.cache.set(signatures[node_id], CacheEntry(result, entry_ui))
        except mem.InterruptProcessingException as iex:
            logging.info("Processing interrupted")
            return ({"node_id": node_id}, iex)
        except Exception as ex:
            _typ, _, tb = sys.exc_info()
            formatted = {name: [format_value(v)] for name, v in (input_data or {}).items()}
            logging.error(f"!!! Exception during processing !!! {ex}")
            logging.error(traceback.format_exc())
            tips = ""
            if mem.is_oom(ex):
                tips = OOM_TIPS
                cuda = api.RUNTIME.device.cuda
                logging.info(f"Memory summary: {cuda.memory_summary() if cuda else ''}")
                logging.error("Got an OOM, unloading all loaded models.")
                api.unload_all_models()
            error = {
                "node_id": node_id,
                "exception_message": f"{ex}\n{tips}",
                "exception_type": full_type_name(type(ex)),
                "traceback": traceback.format_tb(tb),
                "current_inputs": formatted,
            }
            del tb
            return (error, ex)
        self._finish_progress(node_id)
        executed.append(node_id)
        return None

    def _input_data(
        self,
        prompt: dict[str, Any],
        node_id: str,
        cls: type,
        extra_data: dict[str, Any],
        signatures: dict[str, str],
        outputs: dict[str, tuple[Any, ...]],
    ) -> dict[str, Any]:
        spec = cls.INPUT_TYPES()
        declared = {**(spec.get("required") or {}), **(spec.get("optional") or {})}
        data: dict[str, Any] = {}
        for name, value in (prompt[node_id].get("inputs", {}) or {}).items():
            if _is_link(value) and len(value) == 2:
                upstream = str(value[0])
                produced = outputs.get(upstream)
                if produced is None:
                    entry = self.cache.get(signatures[upstream])
                    produced = entry.outputs if entry else ()
                slot = int(value[1])
                data[name] = produced[slot] if slot < len(produced) else None
            elif name in declared:
                if isinstance(value, dict) and "__value__" in value:
                    value = value["__value__"]
                kind = declared[name][0]
                if kind == "INT":
                    value = int(value)
                elif kind == "FLOAT":
                    value = float(value)
                data[name] = value
        for name, kind in (spec.get("hidden") or {}).items():
            if kind == "PROMPT":
                data[name] = prompt
            elif kind == "EXTRA_PNGINFO":
                data[name] = extra_data.get("extra_pnginfo")
            elif kind == "UNIQUE_ID":
                data[name] = node_id
        return data

    def _handle_error(
        self,
        prompt_id: str,
        prompt: dict[str, Any],
        current_outputs: list[str],
        executed: list[str],
        error: dict[str, Any],
        ex: BaseException,
    ) -> None:
        node_id = error["node_id"]
        class_type = prompt[node_id]["class_type"]
        if isinstance(ex, mem.InterruptProcessingException):
            mes = {
                "prompt_id": prompt_id,
                "node_id": node_id,
                "node_type": class_type,
                "executed": list(executed),
            }
            self.add_message("execution_interrupted", mes, broadcast=True)
        else:
            mes = {
                "prompt_id": prompt_id,
                "node_id": node_id,
                "node_type": class_type,
                "executed": list(executed),
                "exception_message": error["exception_message"],
                "exception_type": error["exception_type"],
                "traceback": error["traceback"],
                "current_inputs": error["current_inputs"],
                "current_outputs": list(current_outputs),
            }
            self.add_message("execution_error", mes, broadcast=False)


# A 1x1 PNG for binary preview frames (type 1, format 2 = PNG).
PREVIEW_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de"
    "0000000c4944415408d763f8ffff3f0005fe02fea7d6a4100000000049454e44ae426082"
)


def prompt_worker(queue: PromptQueue, server: Server, executor: PromptExecutor) -> None:
    """The single worker thread: one prompt at a time, then the /free flags, then gc."""
    last_gc = time.perf_counter()
    need_gc = False
    gc_interval_s = 10.0
    while True:
        timeout = 1000.0
        if need_gc:
            timeout = max(gc_interval_s - (time.perf_counter() - last_gc), 0.0)
        got = queue.get(timeout=timeout)
        if got is not None:
            item, item_id = got
            started = time.perf_counter()
            prompt_id = item[1]
            server.last_prompt_id = prompt_id
            extra_data = dict(item[3])
            extra_data.update(item[5] if len(item) > 5 else {})
            executor.execute(item[2], prompt_id, extra_data, item[4])
            need_gc = True
            queue.task_done(
                item_id,
                executor.history_result,
                ExecutionStatus(
                    "success" if executor.success else "error",
                    executor.success,
                    executor.status_messages,
                ),
            )
            if server.client_id is not None:
                server.send_sync(
                    "executing", {"node": None, "prompt_id": prompt_id}, server.client_id
                )
            elapsed = time.perf_counter() - started
            if elapsed > 600:
                logging.info(
                    "Prompt executed in " + time.strftime("%H:%M:%S", time.gmtime(elapsed))
                )
            else:
                logging.info(f"Prompt executed in {elapsed:.2f} seconds")

        flags = queue.get_flags()
        free_memory = flags.get("free_memory", False)
        if flags.get("unload_models", free_memory):
            api.unload_all_models()
            need_gc = True
            last_gc = 0.0
        if free_memory:
            executor.reset()
            need_gc = True
            last_gc = 0.0
        if need_gc and time.perf_counter() - last_gc > gc_interval_s:
            import gc

            gc.collect()
            api.RUNTIME.device.empty_cache()
            last_gc = time.perf_counter()
            need_gc = False
