"""UI workflow → API prompt conversion, checked against hand-built graphs with the prompt
ComfyUI's frontend would send, and against real workflows paired with the prompt ComfyUI
actually ran (tests/workflows/README.md says where each comes from)."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oom_sentinel.bisect.workflow.ui_to_api import ConversionResult, convert, is_ui_workflow
from oom_sentinel.daemon.core.errors import InputError

HERE = Path(__file__).parent / "workflows"
OBJECT_INFO: dict[str, Any] = json.loads((HERE / "object_info.json").read_text())

HAND_BUILT = sorted(p.name.removesuffix(".workflow.json") for p in HERE.glob("*.workflow.json"))
REAL = sorted(
    p.name.removesuffix(".workflow.json") for p in (HERE / "real").glob("*.workflow.json")
)

#: Inputs a newer ComfyUI has that the real prompt (made by an older one) lacks: the converter
#: fills them with the object_info default, as today's frontend would.
REAL_DRIFT = {"hidream_e1": {("37:7", "style")}}


def load(name: str) -> dict[str, Any]:
    return json.loads((HERE / f"{name}.workflow.json").read_text())


def expected(name: str) -> dict[str, Any]:
    return json.loads((HERE / f"{name}.expected.json").read_text())


def node(
    id_: int, type_: str, widgets: Any = None, inputs: Any = (), outputs: Any = (), **kw: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": id_,
        "type": type_,
        "mode": 0,
        "inputs": list(inputs),
        "outputs": list(outputs),
    }
    if widgets is not None:
        out["widgets_values"] = widgets
    out.update(kw)
    return out


def run(
    nodes: list[dict[str, Any]], links: list[Any] | None = None, info: Any = None, **extra: Any
) -> ConversionResult:
    return convert(
        {"nodes": nodes, "links": links or [], **extra}, OBJECT_INFO if info is None else info
    )


# --------------------------------------------------------------------------------------------
# Corpora


@pytest.mark.parametrize("name", HAND_BUILT, ids=HAND_BUILT)
def test_hand_built_workflow_converts_to_the_expected_prompt(name: str) -> None:
    result = convert(load(name), OBJECT_INFO)
    assert result.prompt == expected(name)


@pytest.mark.parametrize("name", REAL, ids=REAL)
def test_real_workflow_converts_to_the_prompt_comfyui_ran(name: str) -> None:
    ui = json.loads((HERE / "real" / f"{name}.workflow.json").read_text())
    ran = json.loads((HERE / "real" / f"{name}.prompt.json").read_text())
    got = convert(ui, OBJECT_INFO).prompt

    assert set(got) == set(ran)
    drift: set[tuple[str, str]] = set()
    for node_id, want in ran.items():
        have = got[node_id]
        assert have["class_type"] == want["class_type"], node_id
        if "_meta" in want:  # prompts made before 2024-11 carry no _meta
            assert have["_meta"] == want["_meta"], node_id
        # Old frontends also sent the upload button's value; the server ignores it.
        want_inputs = {
            k: v for k, v in want["inputs"].items() if k not in ("upload", "choose file to upload")
        }
        for key, value in have["inputs"].items():
            if key not in want_inputs:
                drift.add((node_id, key))
                specs = OBJECT_INFO[have["class_type"]]["input"]
                spec = {**specs.get("required", {}), **specs.get("optional", {})}[key]
                choices = spec[1].get("options") or [None]
                assert value == spec[1].get("default", choices[0]), (node_id, key)
            else:
                assert value == want_inputs[key], (node_id, key)  # 8 == 8.0: the server coerced
        assert set(want_inputs) <= set(have["inputs"]), node_id
    assert drift == REAL_DRIFT.get(name, set())


def test_every_corpus_has_fixtures() -> None:
    assert len(HAND_BUILT) >= 13 and len(REAL) >= 7


# --------------------------------------------------------------------------------------------
# Widget values


def test_old_server_without_input_order_uses_the_dict_order() -> None:
    info = copy.deepcopy(OBJECT_INFO)
    for entry in info.values():
        entry.pop("input_order", None)
    assert convert(load("txt2img"), info).prompt == expected("txt2img")


def test_input_order_wins_over_the_dict_order_when_present() -> None:
    info = {
        "Pair": {
            "input": {"required": {"b": ["INT", {}], "a": ["STRING", {}]}},
            "input_order": {"required": ["a", "b"]},
        }
    }
    got = run([node(1, "Pair", ["text", 5])], info=info).prompt["1"]["inputs"]
    assert got == {"a": "text", "b": 5}
    del info["Pair"]["input_order"]
    got = run([node(1, "Pair", [5, "text"])], info=info).prompt["1"]["inputs"]
    assert got == {"b": 5, "a": "text"}


def test_optional_widgets_follow_the_required_ones() -> None:
    info = {
        "Opt": {
            "input": {"required": {"x": ["INT", {}]}, "optional": {"y": ["FLOAT", {}]}},
            "input_order": {"required": ["x"], "optional": ["y"]},
        }
    }
    assert run([node(1, "Opt", [3, 0.5])], info=info).prompt["1"]["inputs"] == {"x": 3, "y": 0.5}


SEED_INFO = {
    "Flagless": {"input": {"required": {"seed": ["INT", {}], "steps": ["INT", {}]}}},
    "Declined": {
        "input": {
            "required": {"seed": ["INT", {"control_after_generate": False}], "steps": ["INT", {}]}
        }
    },
    "Flagged": {
        "input": {
            "required": {"value": ["INT", {"control_after_generate": True}], "steps": ["INT", {}]}
        }
    },
    "ComboCtl": {
        "input": {
            "required": {
                "pick": [["a.safetensors", "b.safetensors"], {"control_after_generate": True}],
                "steps": ["INT", {}],
            }
        }
    },
}


@pytest.mark.parametrize(
    ("type_", "values", "want"),
    [
        ("Flagless", [7, "randomize", 30], {"seed": 7, "steps": 30}),
        ("Flagless", [7, 30], {"seed": 7, "steps": 30}),
        ("Flagless", [7, True, 30], {"seed": 7, "steps": 30}),
        ("Declined", [7, 30], {"seed": 7, "steps": 30}),
        ("Flagged", [7, "increment", 30], {"value": 7, "steps": 30}),
        ("Flagged", [7, None, 30], {"value": 7, "steps": 30}),
        ("ComboCtl", ["b.safetensors", "fixed", "", 30], {"pick": "b.safetensors", "steps": 30}),
    ],
    ids=[
        "seed-name-gets-a-control-value",
        "workflow-saved-without-the-control-value",
        "early-2023-boolean-toggle",
        "explicit-false-beats-the-seed-name",
        "flag-on-any-int",
        "sparse-hole-for-the-control",
        "combo-control-adds-a-filter-box",
    ],
)
def test_control_after_generate_companions_are_skipped(
    type_: str, values: list[Any], want: dict[str, Any]
) -> None:
    assert run([node(1, type_, values)], info=SEED_INFO).prompt["1"]["inputs"] == want


def test_declined_control_keeps_a_literal_control_word_as_the_next_value() -> None:
    info = {
        "Declined": {
            "input": {
                "required": {
                    "seed": ["INT", {"control_after_generate": False}],
                    "mode": ["STRING", {}],
                }
            }
        }
    }
    assert run([node(1, "Declined", [7, "fixed"])], info=info).prompt["1"]["inputs"] == {
        "seed": 7,
        "mode": "fixed",
    }


def test_upload_button_value_sits_after_the_required_widgets() -> None:
    info = {
        "MaskTool": {
            "input": {
                "required": {
                    "image": [["a.png"], {"image_upload": True}],
                    "channel": [["alpha", "red"]],
                },
                "optional": {"feather": ["INT", {"default": 0}]},
            }
        }
    }
    got = run([node(1, "MaskTool", ["a.png", "red", "image", 6])], info=info).prompt["1"]["inputs"]
    assert got == {"image": "a.png", "channel": "red", "feather": 6}
    got = run([node(1, "MaskTool", ["a.png", "red"])], info=info).prompt["1"]["inputs"]
    assert got == {"image": "a.png", "channel": "red", "feather": 0}


def test_legacy_force_input_positions_are_skipped_when_the_count_says_so() -> None:
    info = {
        "Forced": {
            "input": {
                "required": {
                    "text": ["STRING", {"forceInput": True}],
                    "scale": ["FLOAT", {}],
                    "n": ["INT", {}],
                }
            }
        }
    }
    link_in = [{"name": "text", "type": "STRING", "link": None, "widget": {"name": "text"}}]
    assert run([node(1, "Forced", [1.5, 2], link_in)], info=info).prompt["1"]["inputs"] == {
        "scale": 1.5,
        "n": 2,
    }
    # saved by a frontend that still kept a widget for the forceInput input
    assert run([node(1, "Forced", ["", 1.5, 2], link_in)], info=info).prompt["1"]["inputs"] == {
        "scale": 1.5,
        "n": 2,
    }


def test_extra_trailing_values_are_tolerated() -> None:
    got = run([node(9, "SaveImage", ["ComfyUI", "", None])]).prompt["9"]["inputs"]
    assert got == {"filename_prefix": "ComfyUI"}


def test_dict_shaped_extra_widgets_are_reported() -> None:
    result = run([node(9, "SaveImage", ["x", {"lora": "a.safetensors", "on": True}])])
    assert result.prompt["9"]["inputs"] == {"filename_prefix": "x"}
    assert any("not described by object_info" in w for w in result.warnings)


def test_missing_widget_value_takes_the_default_and_says_so() -> None:
    result = run([node(5, "EmptyLatentImage", [640])])
    assert result.prompt["5"]["inputs"] == {"width": 640, "height": 512, "batch_size": 1}
    assert sum("used the default" in w for w in result.warnings) == 2


def test_widget_without_value_or_default_is_left_out_with_a_warning() -> None:
    info = {"NoDefault": {"input": {"required": {"name": ["COMBO", {"options": []}]}}}}
    result = run([node(1, "NoDefault", [])], info=info)
    assert result.prompt["1"]["inputs"] == {}
    assert any("no default" in w for w in result.warnings)


def test_list_values_are_boxed_so_they_do_not_read_as_links() -> None:
    info = {"Points": {"input": {"required": {"points": ["STRING", {}]}}}}
    assert run([node(1, "Points", [[1, 2]])], info=info).prompt["1"]["inputs"] == {
        "points": {"__value__": [1, 2]}
    }


def test_widgets_values_named_overrides_positions() -> None:
    n = node(5, "EmptyLatentImage", [512, 512, 1], widgets_values_named={"height": 768})
    assert run([n]).prompt["5"]["inputs"] == {"width": 512, "height": 768, "batch_size": 1}


def test_title_falls_back_to_display_name_then_type() -> None:
    prompt = run(
        [
            node(4, "CheckpointLoaderSimple", ["m.safetensors"]),
            node(2, "ImageBlur", [1, 1.0]),
            node(3, "ImageInvert", title="Mine"),
        ]
    ).prompt
    assert prompt["4"]["_meta"] == {"title": "Load Checkpoint"}
    assert prompt["2"]["_meta"] == {"title": "ImageBlur"}  # a V3 node with no display name
    assert prompt["3"]["_meta"] == {"title": "Mine"}


# --------------------------------------------------------------------------------------------
# Links


def test_schema1_object_links_and_04_array_links_give_the_same_prompt() -> None:
    wf = load("txt2img")
    wf["links"] = [
        {
            "id": ln[0],
            "origin_id": ln[1],
            "origin_slot": ln[2],
            "target_id": ln[3],
            "target_slot": ln[4],
            "type": ln[5],
        }
        for ln in wf["links"]
    ]
    wf["version"] = 1
    assert convert(wf, OBJECT_INFO).prompt == expected("txt2img")


def test_link_to_a_missing_node_or_link_is_a_warning_not_a_crash() -> None:
    nodes = [
        node(
            8,
            "VAEDecode",
            inputs=[
                {"name": "samples", "type": "LATENT", "link": 7},
                {"name": "vae", "type": "VAE", "link": 99},
            ],
        )
    ]
    result = run(nodes, [[7, 3, 0, 8, 0, "LATENT"], ["bad"], None])
    assert result.prompt["8"]["inputs"] == {}
    assert any("missing node 3" in w for w in result.warnings)
    assert any("link 99 does not exist" in w for w in result.warnings)
    assert any("malformed" in w or "neither" in w for w in result.warnings)


def test_reroute_cycle_is_reported_and_does_not_loop() -> None:
    nodes = [
        node(
            1,
            "Reroute",
            inputs=[{"name": "", "type": "*", "link": 2}],
            outputs=[{"name": "", "type": "*", "links": [1, 3]}],
        ),
        node(
            2,
            "Reroute",
            inputs=[{"name": "", "type": "*", "link": 1}],
            outputs=[{"name": "", "type": "*", "links": [2]}],
        ),
        node(3, "PreviewImage", inputs=[{"name": "images", "type": "IMAGE", "link": 3}]),
    ]
    result = run(nodes, [[1, 1, 0, 2, 0, "*"], [2, 2, 0, 1, 0, "*"], [3, 1, 0, 3, 0, "IMAGE"]])
    assert result.prompt["3"]["inputs"] == {}
    assert any("circular" in w for w in result.warnings)


def test_unknown_frontend_only_node_without_links_is_skipped_with_a_warning() -> None:
    result = run([node(1, "Image Comparer Deluxe", [])])
    assert result.prompt == {}
    assert any("treated as frontend-only" in w for w in result.warnings)


def test_unknown_backend_node_is_kept_with_its_links() -> None:
    result = convert(load("set_get_and_unknown"), OBJECT_INFO)
    assert result.prompt["4"]["class_type"] == "UpscaleWithMagic"
    assert [w for w in result.warnings if "UpscaleWithMagic" in w]


def test_get_node_without_a_set_node_leaves_the_input_unset() -> None:
    nodes = [
        node(3, "GetNode", ["nowhere"], outputs=[{"name": "IMAGE", "type": "IMAGE", "links": [2]}]),
        node(5, "PreviewImage", inputs=[{"name": "images", "type": "IMAGE", "link": 2}]),
    ]
    result = run(nodes, [[2, 3, 0, 5, 0, "IMAGE"]])
    assert result.prompt["5"]["inputs"] == {}
    assert any("no SetNode named 'nowhere'" in w for w in result.warnings)


def test_muted_source_drops_the_input_and_warns() -> None:
    result = convert(load("muted_node"), OBJECT_INFO)
    assert "10" not in result.prompt and "11" not in result.prompt
    assert any("input 'model' comes from node 10" in w for w in result.warnings)


# --------------------------------------------------------------------------------------------
# Subgraphs and group nodes


def test_muted_or_bypassed_subgraph_instance() -> None:
    wf = load("nested_subgraph")
    wf["nodes"][2]["mode"] = 2
    muted = convert(wf, OBJECT_INFO).prompt
    assert not [k for k in muted if k.startswith("30:")]
    assert "images" not in muted["9"]["inputs"]

    wf["nodes"][2]["mode"] = 4  # IMAGE out, no IMAGE in: nothing to pass through
    bypassed = convert(wf, OBJECT_INFO).prompt
    assert not [k for k in bypassed if k.startswith("30:")]
    assert "images" not in bypassed["9"]["inputs"]


def test_muted_group_node_runs_none_of_its_nodes() -> None:
    wf = load("group_node")
    wf["nodes"][4]["mode"] = 2
    prompt = convert(wf, OBJECT_INFO).prompt
    assert not [k for k in prompt if k.startswith("20:")]


def test_group_node_without_definition_is_skipped_with_a_warning() -> None:
    wf = load("group_node")
    wf["extra"]["groupNodes"] = {}
    result = convert(wf, OBJECT_INFO)
    assert not [k for k in result.prompt if k.startswith("20:")]
    assert any("no definition in extra.groupNodes" in w for w in result.warnings)


def test_group_node_instance_widgets_override_inner_values() -> None:
    wf = load("group_node")
    wf["nodes"][4]["widgets_values"] = []  # no instance values: the definition's own apply
    prompt = convert(wf, OBJECT_INFO).prompt
    assert prompt["20:0"]["inputs"]["steps"] == 20 and prompt["20:0"]["inputs"]["seed"] == 1


def test_subgraph_that_contains_itself_stops_with_a_warning() -> None:
    sid = "5f0e0000-0000-4000-8000-000000000001"
    definition = {
        "id": sid,
        "name": "loop",
        "inputs": [],
        "outputs": [],
        "links": [],
        "nodes": [node(1, sid), node(2, "ImageInvert")],
    }
    result = run([node(7, sid)], definitions={"subgraphs": [definition]})
    assert any("contains itself" in w for w in result.warnings)
    assert set(result.prompt) == {"7:2"}


def test_very_deep_nesting_stops_with_a_warning() -> None:
    ids = [f"5f0e0000-0000-4000-8000-{i:012d}" for i in range(40)]
    defs = [
        {
            "id": sid,
            "name": f"level {i}",
            "inputs": [],
            "outputs": [],
            "links": [],
            "nodes": [node(1, ids[i + 1])] if i + 1 < len(ids) else [node(1, "ImageInvert")],
        }
        for i, sid in enumerate(ids)
    ]
    result = run([node(7, ids[0])], definitions={"subgraphs": defs})
    assert result.prompt == {}
    assert any("nested deeper than" in w for w in result.warnings)


def test_group_node_inside_a_subgraph_is_refused_like_the_frontend_does() -> None:
    wf = load("group_node")
    sid = "5f0e0000-0000-4000-8000-0000000000aa"
    inner = [n for n in wf["nodes"] if n["id"] == 20]
    definition = {
        "id": sid,
        "name": "wrapper",
        "inputs": [],
        "outputs": [],
        "links": [],
        "nodes": inner,
    }
    result = run([node(60, sid)], extra=wf["extra"], definitions={"subgraphs": [definition]})
    assert result.prompt == {}
    assert any("group nodes inside subgraphs" in w for w in result.warnings)


def test_promoted_value_without_proxy_widgets_skips_a_legacy_control_slot() -> None:
    wf = load("subgraph_two_instances")
    wf["nodes"][1]["widgets_values"] = ["a sunny meadow", "randomize"]
    assert convert(wf, OBJECT_INFO).prompt["40:1"]["inputs"]["text"] == "a sunny meadow"


def test_instance_link_beats_the_promoted_value() -> None:
    wf = load("subgraph_two_instances")
    wf["nodes"].append(
        node(
            50,
            "PrimitiveStringMultiline",
            ["from outside"],
            outputs=[{"name": "STRING", "type": "STRING", "links": [50]}],
        )
    )
    wf["nodes"][1]["inputs"].append(
        {"name": "text", "type": "STRING", "link": 50, "widget": {"name": "text"}}
    )
    wf["links"].append([50, 50, 0, 40, 1, "STRING"])
    prompt = convert(wf, OBJECT_INFO).prompt
    assert prompt["40:1"]["inputs"]["text"] == ["50", 0]


# --------------------------------------------------------------------------------------------
# Shape errors and robustness


@pytest.mark.parametrize(
    "doc",
    [{}, {"nodes": {}}, [], "nodes"],
    ids=["empty-object", "nodes-not-a-list", "a-list", "a-string"],
)
def test_not_a_ui_workflow_raises_input_error(doc: Any) -> None:
    assert not is_ui_workflow(doc)
    with pytest.raises(InputError, match="no 'nodes' list"):
        convert(doc, OBJECT_INFO)


def test_object_info_must_be_an_object() -> None:
    with pytest.raises(InputError, match="object_info"):
        convert(load("txt2img"), [])  # type: ignore[arg-type]


json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-5, 40)
    | st.floats(allow_nan=False)
    | st.text(max_size=4)
)
json_value = st.recursive(
    json_leaf,
    lambda c: st.lists(c, max_size=6) | st.dictionaries(st.text(max_size=6), c, max_size=6),
    max_leaves=30,
)
node_like = st.fixed_dictionaries(
    {
        "id": st.integers(-20, 20) | st.text(max_size=3),
        "type": st.sampled_from(
            ["KSampler", "Reroute", "PrimitiveNode", "SaveImage", "LoadImage", "Nope", "workflow>G"]
        ),
        "mode": st.sampled_from([0, 2, 4, "x"]),
        "inputs": json_value,
        "widgets_values": json_value,
    }
)


@settings(max_examples=150, deadline=None)
@given(nodes=st.lists(node_like, max_size=6), links=json_value, extra=json_value)
def test_arbitrary_graphs_never_crash(nodes: list[Any], links: Any, extra: Any) -> None:
    result = convert({"nodes": nodes, "links": links, "extra": extra}, OBJECT_INFO)
    assert isinstance(result.prompt, dict)
    json.dumps(result.prompt)


_JUNK: list[Any] = [
    None,
    True,
    0,
    -10,
    -20,
    3,
    2.5,
    "",
    "x",
    "-10",
    [],
    {},
    [1, 2],
    {"a": 1},
    "workflow>x",
]
_ALL_FIXTURES = [HERE / f"{n}.workflow.json" for n in HAND_BUILT] + [
    HERE / "real" / f"{n}.workflow.json" for n in REAL
]


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += _paths(v, (*prefix, i))
    return found


@settings(max_examples=200, deadline=None)
@given(rnd=st.randoms(use_true_random=False))
def test_mutated_fixtures_never_crash(rnd: Any) -> None:
    doc = json.loads(rnd.choice(_ALL_FIXTURES).read_text())
    paths = _paths(doc)[1:]
    for _ in range(rnd.randint(1, 4)):
        path = rnd.choice(paths)
        parent: Any = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            if isinstance(parent, dict) and rnd.random() < 0.3:
                del parent[path[-1]]
            else:
                # a fresh copy: a shared [] or {} could be put inside itself by a later
                # mutation, a cycle no JSON document can hold (and _JUNK would change)
                parent[path[-1]] = copy.deepcopy(rnd.choice(_JUNK))
        except (KeyError, IndexError, TypeError):
            continue
    try:
        result = convert(doc, OBJECT_INFO)
    except InputError:
        return
    json.dumps(result.prompt)


# --------------------------------------------------------------------------------------------
# Against a real ComfyUI (only with $OOM_SENTINEL_REAL_COMFYUI)


@pytest.fixture(scope="module")
def real_comfyui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ComfyUI on 127.0.0.1 with its own dirs and an in-memory database; its Python is
    $OOM_SENTINEL_REAL_COMFYUI_PYTHON (else this interpreter). $OOM_SENTINEL_REAL_COMFYUI_URL
    reuses a server that is already running."""
    url = os.environ.get("OOM_SENTINEL_REAL_COMFYUI_URL")
    if url:
        yield url.rstrip("/")
        return
    checkout = Path(os.environ["OOM_SENTINEL_REAL_COMFYUI"])
    python = os.environ.get("OOM_SENTINEL_REAL_COMFYUI_PYTHON", sys.executable)
    base = tmp_path_factory.mktemp("comfy")
    dirs = {name: base / name for name in ("user", "input", "output", "temp")}
    for d in dirs.values():
        d.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [
        python,
        "main.py",
        "--cpu",
        "--listen",
        "127.0.0.1",
        "--port",
        str(port),
        "--user-directory",
        str(dirs["user"]),
        "--input-directory",
        str(dirs["input"]),
        "--output-directory",
        str(dirs["output"]),
        "--temp-directory",
        str(dirs["temp"]),
        "--database-url",
        "sqlite:///:memory:",
        "--disable-auto-launch",
    ]
    log = (base / "comfyui.log").open("wb")
    proc = subprocess.Popen(argv, cwd=checkout, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                pytest.fail(f"ComfyUI exited with {proc.returncode}; see {base / 'comfyui.log'}")
            try:
                urllib.request.urlopen(url + "/system_stats", timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _validate(url: str, prompt: dict[str, Any]) -> list[tuple[str, str]]:
    """POST the prompt and return the errors that are not about missing model/input files."""
    body = json.dumps({"prompt": prompt, "client_id": "oom-sentinel-test"}).encode()
    request = urllib.request.Request(
        url + "/prompt", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request) as response:
            answer = json.load(response)
        # Valid: take it off the queue again (nothing may run: no models here).
        clear = urllib.request.Request(
            url + "/queue", data=b'{"clear": true}', headers={"Content-Type": "application/json"}
        )
        urllib.request.urlopen(clear).close()
        urllib.request.urlopen(urllib.request.Request(url + "/interrupt", data=b"{}")).close()
    except urllib.error.HTTPError as exc:
        answer = json.load(exc)
    problems = []
    if answer.get("error", {}).get("type") == "invalid_prompt":
        problems.append(("-", answer["error"]["message"]))
    for node_id, entry in answer.get("node_errors", {}).items():
        for error in entry["errors"]:
            missing_file = error[
                "type"
            ] == "value_not_in_list" or "Invalid image file" in error.get("details", "")
            if not missing_file:
                problems.append((node_id, f"{error['type']}: {error.get('details', '')}"))
    return problems


#: A muted LoRA leaves its consumers without inputs: the server must say so.
REAL_VALIDATION_EXPECTED = {
    "muted_node": [
        ("3", "required_input_missing: model"),
        ("6", "required_input_missing: clip"),
        ("7", "required_input_missing: clip"),
    ]
}


@pytest.mark.real_comfyui
@pytest.mark.slow
@pytest.mark.parametrize(
    "name", HAND_BUILT + [f"real/{n}" for n in REAL], ids=HAND_BUILT + [f"real-{n}" for n in REAL]
)
def test_converted_prompt_passes_real_validation(real_comfyui: str, name: str) -> None:
    with urllib.request.urlopen(real_comfyui + "/object_info") as response:
        live_info = json.load(response)
    result = convert(json.loads((HERE / f"{name}.workflow.json").read_text()), live_info)
    known_unknown = {n for n, e in result.prompt.items() if e["class_type"] not in live_info}
    problems = [p for p in _validate(real_comfyui, result.prompt) if p[0] not in known_unknown]
    if known_unknown:  # the server names the first missing class and stops there
        problems = [p for p in problems if "does not exist" not in p[1]]
    assert sorted(problems) == REAL_VALIDATION_EXPECTED.get(name, [])
