"""The stand-in's node-execution hook point, named and shaped as ComfyUI's ``execution.execute``.

Real ComfyUI (v0.3.x-v0.8) runs every node through the module-level
``execution.execute(server, dynprompt, caches, current_item, extra_data, executed, prompt_id,
execution_list, pending_subgraph_results, ...)`` and looks it up at call time, so a wrapper
installed when the module is imported sees each node's start and end; ``dynprompt.get_node(id)``
gives its ``class_type``. The replay bootstrap (``bisect/measure/bootstrap.py``) wraps exactly that;
the stand-in's executor calls it the same way, so the stand-in tests exercise the same hook.
"""

from __future__ import annotations

from typing import Any


class DynamicPrompt:
    """The part of ComfyUI's ``comfy_execution.graph.DynamicPrompt`` the hook reads."""

    def __init__(self, prompt: dict[str, Any]) -> None:
        self.prompt = prompt

    def get_node(self, node_id: str) -> dict[str, Any]:
        return self.prompt[node_id]


def execute(
    server: Any,
    dynprompt: DynamicPrompt,
    caches: Any,
    current_item: str,
    extra_data: dict[str, Any],
    executed: list[str],
    prompt_id: str,
    execution_list: Any,
    pending_subgraph_results: dict[str, Any],
) -> Any:
    """Run one node; ``caches`` is the stand-in's executor, ``execution_list`` its run state."""
    return caches.run_node(current_item, prompt_id, extra_data, executed, execution_list)
