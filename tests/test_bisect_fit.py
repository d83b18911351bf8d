"""``oom-bisect fit`` end to end: the real command, a user's install made of a real git history
of the stand-in ComfyUI, a fresh stand-in server per change, the fake GPU for "VRAM" and real
host RAM for the RAM case; and the pure parts (which changes, in which order, how applied).

The stand-in install's tuning multiplies every VRAM allocation by 10 on a 4 GiB fake card, so
a 256 MiB (sparse) checkpoint is a 2.5 GiB model: ComfyUI's loader fills VRAM up to what
``--reserve-vram`` leaves free, which is what makes "only a flag fits" real here.

Every end-to-end test checks that the user's repo and workflow file are byte-for-byte what
they were, and that no ComfyUI is left running.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from cli_json import json_answer
from daemon_harness import snapshots_show
from standin_repos import build_core_repo, repo_fingerprint

from oom_sentinel.bisect.fit.candidates import (
    ALLOC_CONF,
    TILED_DEFAULTS,
    Change,
    apply_flags,
    apply_prompt,
    combinations,
    combine,
    flag_candidates,
    knob_candidates,
    order,
)
from oom_sentinel.bisect.fit.experiment import Experiment, judge
from oom_sentinel.bisect.measure.flags import parse_cli_args
from oom_sentinel.bisect.measure.replay import Measurement, Peaks
from oom_sentinel.bisect.search.verdict import Ok, Oom, Threshold
from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir

GIB = 1024**3
MIB = 1024**2
STANDIN_CLI = (Path(__file__).parent / "standin" / "cli_args_template.py").read_text()
SPEC = parse_cli_args(STANDIN_CLI)


# ---------------------------------------------------------------------------- pure: candidates


def keys(changes: list[Change]) -> list[str]:
    return [c.key for c in changes]


def test_a_ram_failure_is_offered_ram_flags_and_never_vram_modes() -> None:
    got = keys(order(flag_candidates("ram", SPEC, gpu=True)))
    assert got == [
        "disable-pinned-memory",
        "cache-lru-1",
        "cache-none",
        "disable-smart-memory",
    ]


def test_a_vram_failure_is_offered_vram_flags_cheapest_first() -> None:
    got = keys(order(flag_candidates("vram", SPEC, gpu=True, model=True)))
    assert got == [
        "reserve-vram-1.0",
        "expandable-segments",
        "disable-smart-memory",
        "use-split-cross-attention",
        "fp8-e4m3fn-unet",
        "lowvram",
        "novram",
    ]
    # fragmentation: the allocator setting is the first thing to try
    frag = keys(order(flag_candidates("vram", SPEC, gpu=True, fragmentation=True)))
    assert frag[0] == "expandable-segments"
    # no model in the prompt: no attention or weight-precision flags
    assert "fp8-e4m3fn-unet" not in keys(flag_candidates("vram", SPEC, gpu=True, model=False))


def test_flags_follow_the_commit_the_device_and_the_users_own_flags() -> None:
    old = parse_cli_args(
        "\n".join(
            line
            for line in STANDIN_CLI.splitlines()
            if "--reserve-vram" not in line and "--disable-pinned-memory" not in line
        )
    )
    assert "reserve-vram-1.0" not in keys(flag_candidates("vram", old, gpu=True))
    assert "disable-pinned-memory" not in keys(flag_candidates("ram", old))
    with_dynamic = parse_cli_args(
        STANDIN_CLI + '\nparser.add_argument("--disable-dynamic-vram", action="store_true")\n'
    )
    assert "disable-dynamic-vram" in keys(flag_candidates("vram", with_dynamic, gpu=True))
    # --cpu or no GPU: no VRAM flag at all
    assert flag_candidates("vram", SPEC, gpu=False) == []
    assert flag_candidates("vram", SPEC, gpu=True, user_flags=["--cpu"]) == []
    # a flag the user already runs with is not offered again; --reserve-vram goes up by 1 GB
    mine = keys(
        flag_candidates("vram", SPEC, gpu=True, user_flags=["--lowvram", "--reserve-vram", "2"])
    )
    assert "lowvram" not in mine and "reserve-vram-3.0" in mine
    # an allocator setting the user already has is kept, expandable segments appended
    (env,) = [
        c
        for c in flag_candidates(
            "vram", SPEC, gpu=True, environ={ALLOC_CONF: "max_split_size_mb:128"}
        )
        if c.kind == "env"
    ]
    assert env.env == ((ALLOC_CONF, "max_split_size_mb:128,expandable_segments:True"),)
    assert env.flags == ("--disable-cuda-malloc",)


def test_a_new_vram_mode_replaces_the_users_and_keeps_the_rest() -> None:
    novram = next(c for c in flag_candidates("vram", SPEC, gpu=True) if c.key == "novram")
    assert apply_flags(["--lowvram", "--preview-method", "auto"], novram, SPEC) == (
        "--preview-method",
        "auto",
        "--novram",
    )
    reserve = next(
        c for c in flag_candidates("vram", SPEC, gpu=True) if c.key == "reserve-vram-1.0"
    )
    assert apply_flags(["--reserve-vram", "0.5", "--cpu-vae"], reserve, SPEC) == (
        "--cpu-vae",
        "--reserve-vram",
        "1.0",
    )
    assert apply_flags(["--x"], None, SPEC) == ("--x",)


PROMPT = {
    "1": {
        "class_type": "EmptyLatentImage",
        "inputs": {"width": 1024, "height": 768, "batch_size": 4},
    },
    "2": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "m.safetensors"}},
    "3": {
        "class_type": "KSampler",
        "inputs": {"model": ["2", 0], "latent_image": ["1", 0], "seed": 1, "steps": 20},
    },
    "4": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["2", 2]}},
    "5": {"class_type": "WanImageToVideo", "inputs": {"width": 832, "height": 480, "length": 81}},
    "6": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "x"}},
}


def test_knobs_are_what_the_prompt_exposes() -> None:
    knobs = {c.key: c for c in knob_candidates(PROMPT, tiled_vae=TILED_DEFAULTS)}
    assert list(knobs) == [
        "tiled-vae-decode",
        "batch-1",
        "frames-half",
        "resolution-x0.75",
        "resolution-x0.5",
    ]
    assert [(e.node, e.input, e.old, e.new) for e in knobs["batch-1"].edits] == [
        ("1", "batch_size", 4, 1)
    ]
    assert [(e.input, e.old, e.new) for e in knobs["frames-half"].edits] == [("length", 81, 41)]
    half = {(e.node, e.input): e.new for e in knobs["resolution-x0.5"].edits}
    assert half == {
        ("1", "width"): 512,
        ("1", "height"): 384,
        ("5", "width"): 416,
        ("5", "height"): 240,
    }
    assert knobs["batch-1"].changes_output and not knobs["tiled-vae-decode"].changes_output
    assert knobs["batch-1"].repeat == 4  # four runs of batch 1 give the same images
    tiled = apply_prompt(PROMPT, knobs["tiled-vae-decode"])
    assert tiled["4"]["class_type"] == "VAEDecodeTiled"
    assert tiled["4"]["inputs"] == {"samples": ["3", 0], "vae": ["2", 2], **TILED_DEFAULTS}
    assert PROMPT["4"]["class_type"] == "VAEDecode"  # the original is untouched
    # a core without VAEDecodeTiled: no VAE change
    assert "tiled-vae-decode" not in keys(knob_candidates(PROMPT, tiled_vae=None))
    # linked sizes are not literals: nothing to scale; a scale factor is scaled instead
    scaled = knob_candidates(
        {
            "1": {"class_type": "LoadImage", "inputs": {"image": "a.png"}},
            "2": {"class_type": "ImageScaleBy", "inputs": {"image": ["1", 0], "scale_by": 2.0}},
        }
    )
    assert [(c.key, [e.new for e in c.edits]) for c in scaled] == [
        ("resolution-x0.75", [1.5]),
        ("resolution-x0.5", [1.0]),
    ]


def test_combinations_pair_a_flag_with_a_knob_first_and_never_two_of_a_group() -> None:
    flags = {c.key: c for c in flag_candidates("vram", SPEC, gpu=True, model=False)}
    knobs = {c.key: c for c in knob_candidates(PROMPT)}
    assert combine(flags["lowvram"], flags["novram"]) is None
    assert combine(knobs["resolution-x0.75"], knobs["resolution-x0.5"]) is None
    failed = [flags["reserve-vram-1.0"], flags["lowvram"], knobs["batch-1"]]
    combos = combinations(failed)
    assert [c.key for c in combos] == [
        "reserve-vram-1.0+batch-1",
        "lowvram+batch-1",
        "reserve-vram-1.0+lowvram",
    ]
    both = combos[1]
    assert both.flags == ("--lowvram",) and both.edits == knobs["batch-1"].edits
    assert both.kind == "combination" and both.changes_output


def _m(
    outcome: Any, vram: int | None = None, ram: int | None = None, prompt_s: float = 1.0
) -> Measurement:
    return Measurement(
        outcome=outcome,
        peaks=Peaks(nvml_vram_bytes=vram, tree_rss_bytes=ram),
        timings={"prompt_s": prompt_s},
    )


def test_judging_a_run() -> None:
    budget = Threshold(None, 1 * GIB)
    assert judge(_m(Ok(), ram=GIB // 2), budget)[:2] == (True, "fits")
    assert judge(_m(Ok(), ram=2 * GIB), budget)[1:] == (
        "over-budget",
        "RAM peak over the budget",
        "ram",
    )
    assert judge(_m(Ok(stopped_early=True), ram=2 * GIB), budget)[1] == "over-budget"
    assert judge(_m(Oom("CUDA out of memory", "gpu")), budget)[3] == "vram"


def test_the_experiment_stops_at_the_first_fit_and_combines_only_when_nothing_single_fits() -> None:
    flags = {c.key: c for c in flag_candidates("vram", SPEC, gpu=True, model=False)}
    knobs = {c.key: c for c in knob_candidates(PROMPT)}
    singles = order([flags["reserve-vram-1.0"], flags["lowvram"], knobs["batch-1"]])
    fits_when = {"lowvram+batch-1"}
    seen: list[str] = []

    def measure(change: Change | None) -> Measurement:
        seen.append("baseline" if change is None else change.key)
        if change is not None and change.key in fits_when:
            return _m(Ok(), vram=3 * GIB)
        return _m(Oom("CUDA out of memory", "gpu"), vram=4 * GIB)

    result = Experiment(measure, lambda pool: singles, budget=Threshold()).run()
    assert seen == [
        "baseline",
        "reserve-vram-1.0",
        "lowvram",
        "batch-1",
        "reserve-vram-1.0+batch-1",
        "lowvram+batch-1",
    ]
    assert result.result == "fits" and result.combined
    assert (
        result.recommendation is not None and result.recommendation.change.key == "lowvram+batch-1"
    )
    # a single fit ends it, without combinations
    fits_when = {"lowvram"}
    seen.clear()
    result = Experiment(measure, lambda pool: singles, budget=Threshold()).run()
    assert seen == ["baseline", "reserve-vram-1.0", "lowvram"] and not result.combined
    # a change ComfyUI cannot even start with is no part of a combination
    from oom_sentinel.bisect.search.verdict import Skip

    fits_when = set()
    seen.clear()

    def skip_lowvram(change: Change | None) -> Measurement:
        if change is not None and change.key == "lowvram":
            seen.append(change.key)
            return _m(Skip("won't start: exited with status 2"))
        return measure(change)

    result = Experiment(skip_lowvram, lambda pool: singles, budget=Threshold()).run()
    assert result.combined and not any("lowvram" in k for k in seen[4:]), seen
    assert seen[4:] == ["reserve-vram-1.0+batch-1"]
    # --max-runs bounds everything, the baseline included
    fits_when = set()
    seen.clear()
    result = Experiment(measure, lambda pool: singles, budget=Threshold(), max_runs=3).run()
    assert len(seen) == 3 and result.result == "nothing-fits"
    assert "left untried" in result.message


def test_fit_exit_statuses_are_documented_in_the_readme() -> None:
    from oom_sentinel.bisect.cli.fit import EXIT_NOTHING_FITS

    text = (Path(__file__).parent.parent / "README.md").read_text("utf-8")
    section = text[text.index("### oom-bisect fit") :]
    section = section[: section.index("\n## ")]
    for code, word in (
        (0, "fits"),
        (1, "error"),
        (2, "usage"),
        (3, "input"),
        (4, "nothing fits"),
        (130, "interrupted"),
    ):
        assert re.search(rf"^\| {code} \| .*{word}", section, re.M), f"exit {code} ({word})"
    assert EXIT_NOTHING_FITS == 4


@pytest.mark.parametrize(
    ("args", "status", "text"),
    [
        ([], 2, "give a SNAPSHOT_ID or --workflow FILE"),
        (["20990101T000000Z", "--workflow", "x.json"], 2, "not both"),
        (["--workflow", "{wf}", "--max-runs", "1"], 2, "--max-runs must be at least 2"),
        (["--workflow", "{wf}", "--ram-budget", "lots"], 2, "--ram-budget: 'lots' is not a size"),
        (["--workflow", "{missing}"], 3, "missing.json"),
    ],
    ids=["nothing", "both", "max-runs", "budget", "missing-file"],
)
def test_bad_input_is_one_line_and_a_status(
    tmp_path: Path, args: list[str], status: int, text: str
) -> None:
    from click.testing import CliRunner

    from oom_sentinel.bisect.cli.main import main

    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(blur_prompt(1)))
    words = [a.format(wf=wf, missing=tmp_path / "missing.json") for a in args]
    res = CliRunner().invoke(main, ["fit", *words, "--data-dir", str(tmp_path / "data")])
    assert res.exit_code == status, res.output
    assert text in res.output and "Traceback" not in res.output


# ---------------------------------------------------------------------------- end to end


@dataclass
class FitInstall:
    root: Path
    base: Path
    env: dict[str, str]
    before: dict[str, Any] = field(default_factory=dict)

    def workflow(self, prompt: dict[str, Any], name: str) -> Path:
        path = self.base / f"{name}.json"
        path.write_text(json.dumps(prompt))
        return path

    def fit(self, *args: str, timeout: float = 600) -> tuple[int, dict[str, Any], str]:
        proc = subprocess.run(
            [sys.executable, "-m", "oom_sentinel.bisect", "fit", "--json", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return json_answer(proc)

    def fit_workflow(self, path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        got = self.fit(
            "--workflow", str(path), "--comfyui", str(self.root), "--python", sys.executable, *args
        )
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, "fit wrote the workflow"
        return got

    def assert_untouched(self) -> None:
        assert repo_fingerprint(self.root) == self.before, "oom-bisect fit changed the user's repo"
        for proc in psutil.process_iter(["cmdline"]):
            cmd = " ".join(proc.info.get("cmdline") or [])
            assert str(self.base / "cache") not in cmd, f"ComfyUI left running: {cmd}"


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FitInstall]:
    base = tmp_path_factory.mktemp("fit")
    core = build_core_repo(
        base / "ComfyUI", 3, bad_commit_index=None, extra_tuning={"vram_factor": 10.0}
    )
    ckpt = core.path / "models" / "checkpoints" / "big.safetensors"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    with ckpt.open("wb") as fh:  # sparse: 256 MiB that cost no disk
        fh.truncate(256 * MIB)
    FakeGpuDir(base / "gpu").create([FakeDevice(0, "Fake RTX 3050", 4 * GIB)])
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OOM_STANDIN_", "OOM_SENTINEL_"))
    }
    env.update(
        OOM_SENTINEL_CACHE_DIR=str(base / "cache"),
        OOM_SENTINEL_FAKE_GPU=str(base / "gpu"),
        PYTHONUNBUFFERED="1",
    )
    env.pop(ALLOC_CONF, None)
    inst = FitInstall(core.path, base, env)
    inst.before = repo_fingerprint(core.path)
    yield inst
    inst.assert_untouched()


def labels(doc: dict[str, Any]) -> list[str]:
    return [t["change"]["key"] for t in doc["trials"]]


def model_prompt(vram_mib: int) -> dict[str, Any]:
    """A checkpoint that ComfyUI loads as far as VRAM allows, then ``vram_mib`` (×10) more."""
    return {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "big.safetensors"}},
        "2": {
            "class_type": "EmptyLatentImage",
            "inputs": {"width": 512, "height": 512, "batch_size": 1},
        },
        "3": {
            "class_type": "StandinSampler",
            "inputs": {
                "model": ["1", 0],
                "seed": 0,
                "steps": 2,
                "cfg": 7.0,
                "latent_image": ["2", 0],
                "denoise": 1.0,
            },
        },
        "4": {"class_type": "AllocateVRAM", "inputs": {"mib": vram_mib, "value": ["3", 0]}},
        "5": {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}},
    }


def blur_prompt(batch: int) -> dict[str, Any]:
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 1024, "height": 1024, "batch_size": batch, "color": 0},
        },
        "2": {
            "class_type": "ImageBlur",
            "inputs": {"image": ["1", 0], "blur_radius": 1, "sigma": 1.0},
        },
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }


@pytest.mark.slow
def test_only_a_flag_fits(install: FitInstall) -> None:
    wf = install.workflow(model_prompt(150), "flag")
    code, doc, err = install.fit_workflow(wf, "--keep-going")
    assert (code, doc["result"]) == (0, "fits"), err[-3000:]
    assert doc["baseline"]["verdict"] == "oom" and doc["pool"] == "vram"
    rec = doc["recommendation"]
    assert rec["change"]["key"] == "reserve-vram-1.0" and rec["fits"]
    assert doc["headline"].startswith("fits with --reserve-vram 1.0 (peak ")
    assert " of 4 GiB, " in doc["headline"]
    by_key = {t["change"]["key"]: t for t in doc["trials"]}
    # the knobs of this prompt (its resolution) do not help: the model fills the card
    assert not by_key["resolution-x0.75"]["fits"] and not by_key["resolution-x0.5"]["fits"]
    assert by_key["lowvram"]["fits"] and by_key["novram"]["fits"]
    assert not by_key["expandable-segments"]["fits"]
    assert "--reserve-vram" in rec["argv_flags"]
    assert rec["margin_bytes"] > 0
    # the baseline really ran out of memory: its time is not a full run's, no ratio is claimed
    assert rec["time_vs_baseline"] is None and not doc["baseline_complete"]
    assert re.search(r", prompt \d+\.\d+ s\)$", doc["headline"]), doc["headline"]
    # the changed prompts, beside the report, ready to load; the flags need no file
    report = Path(doc["report"]["dir"])
    half = json.loads((report / "fit-resolution-x0.5.json").read_text())
    assert half["2"]["inputs"]["width"] == 256
    assert not (report / "fit-reserve-vram-1.0.json").exists()
    assert "<svg" in (report / "fit.html").read_text()
    print(f"\n[fit] only a flag: {doc['headline']}; {doc['runs']} runs in {doc['elapsed_s']} s")
    install.assert_untouched()


@pytest.mark.slow
def test_only_a_knob_fits(install: FitInstall) -> None:
    wf = install.workflow(blur_prompt(24), "knob")
    code, doc, err = install.fit_workflow(wf)
    assert (code, doc["result"]) == (0, "fits"), err[-3000:]
    assert labels(doc) == [
        "reserve-vram-1.0",
        "expandable-segments",
        "disable-smart-memory",
        "lowvram",
        "batch-1",
    ]
    assert [t["fits"] for t in doc["trials"]] == [False] * 4 + [True]
    assert doc["recommendation"]["change"]["key"] == "batch-1"
    assert doc["headline"].startswith("fits with batch size 24 → 1 (EmptyImage #1) (peak ")
    assert doc["headline"].endswith(", changes the output)")
    changed = json.loads((Path(doc["report"]["dir"]) / "fit-batch-1.json").read_text())
    assert changed["1"]["inputs"]["batch_size"] == 1
    print(f"\n[fit] only a knob: {doc['headline']}; {doc['runs']} runs in {doc['elapsed_s']} s")
    install.assert_untouched()


@pytest.mark.slow
def test_only_a_combination_fits_and_says_so(install: FitInstall) -> None:
    """The model fills the card; a 2048² blur needs 1.4 GiB (×10) per image: batch 1 alone
    leaves too little beside the model, --reserve-vram alone too little for 4 images."""
    prompt = model_prompt(0)
    del prompt["4"]
    prompt["5"] = {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}}
    # output nodes run in id order: the blur runs after the sampler has loaded the model
    prompt["6"] = {
        "class_type": "EmptyImage",
        "inputs": {"width": 2048, "height": 2048, "batch_size": 4, "color": 0},
    }
    prompt["7"] = {
        "class_type": "ImageBlur",
        "inputs": {"image": ["6", 0], "blur_radius": 1, "sigma": 1.0},
    }
    prompt["8"] = {"class_type": "PreviewAny", "inputs": {"source": ["7", 0]}}
    wf = install.workflow(prompt, "combo")
    code, doc, err = install.fit_workflow(wf, "--max-runs", "16")
    assert (code, doc["result"]) == (0, "fits"), err[-3000:]
    assert doc["combined"] and doc["headline"].startswith(
        "fits only with a combination: --reserve-vram 1.0 + batch size 4 → 1"
    ), doc["headline"]
    singles = [t for t in doc["trials"] if t["change"]["kind"] != "combination"]
    assert singles and not any(t["fits"] for t in singles)
    assert {"batch-1", "reserve-vram-1.0", "novram"} <= {t["change"]["key"] for t in singles}
    assert doc["trials"][-1]["fits"] and doc["trials"][-1]["change"]["parts"] == [
        "reserve-vram-1.0",
        "batch-1",
    ]
    changed = json.loads(
        (Path(doc["report"]["dir"]) / "fit-reserve-vram-1.0+batch-1.json").read_text()
    )
    assert changed["6"]["inputs"]["batch_size"] == 1
    print(f"\n[fit] combination: {doc['headline']}; {doc['runs']} runs in {doc['elapsed_s']} s")
    install.assert_untouched()


@pytest.mark.slow
def test_nothing_fits_exits_4_with_a_clear_message(install: FitInstall) -> None:
    wf = install.workflow(
        {
            "1": {"class_type": "AllocateVRAM", "inputs": {"mib": 500}},
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        },
        "nothing",
    )
    code, doc, err = install.fit_workflow(wf, "--max-runs", "8")
    assert (code, doc["result"]) == (4, "nothing-fits"), err[-3000:]
    assert doc["runs"] == 8 and doc["combined"]
    assert len(doc["trials"]) == 7 and not any(t["fits"] for t in doc["trials"])
    assert [t["change"]["kind"] for t in doc["trials"]][-2:] == ["combination", "combination"]
    assert doc["message"].startswith("nothing fits: the baseline and 7 change(s) all failed")
    assert "(combinations included)" in doc["message"] and "raise --max-runs" in doc["message"]
    install.assert_untouched()


@pytest.mark.slow
def test_a_ram_failure_from_a_snapshot(install: FitInstall) -> None:
    from snapshot_samples import content

    from oom_sentinel.daemon.classify.events import Pool
    from oom_sentinel.daemon.incidents.snapshot import InstanceInfo, snapshots_dir, write_snapshot

    prompt = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 2048, "height": 2048, "batch_size": 8, "color": 0},
        },
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }
    data = install.base / "data"
    snap = write_snapshot(
        snapshots_dir(data),
        dataclasses.replace(
            content(
                pool=Pool.RAM,
                prompt=prompt,
                sections={"process": {"argv": [sys.executable, "main.py", "--cpu"]}},
            ),
            instance=InstanceInfo("main", str(install.root)),
        ),
    )
    before = sorted(p.name for p in snap.path.iterdir())
    code, doc, err = install.fit(
        snap.id, "--data-dir", str(data), "--python", sys.executable, "--ram-budget", "600MiB"
    )
    assert (code, doc["result"]) == (0, "fits"), err[-3000:]
    assert doc["pool"] == "ram" and doc["baseline"]["verdict"] == "over-budget"
    tried = labels(doc)
    assert tried[-1] == "batch-1" and doc["trials"][-1]["fits"]
    assert not any(k in ("lowvram", "novram", "reserve-vram-1.0") for k in tried)
    assert tried[0] == "disable-pinned-memory"
    assert doc["recommendation"]["peak_ram_bytes"] < 600 * MIB
    # over an emulated budget the baseline runs to the end: the speed cost is a real ratio
    assert doc["baseline_complete"] and doc["baseline"]["outcome"]["kind"] == "ok"
    rec = doc["recommendation"]
    assert rec["time_vs_baseline"] is not None
    # batch 8 → 1: the speed cost counts the 8 runs the same images take
    assert rec["time_vs_baseline"] == pytest.approx(
        rec["prompt_s"] * 8 / doc["baseline"]["prompt_s"], rel=0.01
    )
    assert " over 8 runs, changes the output)" in doc["headline"]
    # every trial before the fit was over the budget: stopped when its RAM crossed it, or,
    # where the prompt finished within the watcher's poll after the crossing (a loaded
    # machine), run to the end with its peak over it; either way not a fit
    for t in doc["trials"][:-1]:
        assert t["verdict"] == "over-budget" and not t["fits"], t
        assert t["outcome"].get("stopped_early") or t["peak_ram_bytes"] > 600 * MIB, t
    # attached to the snapshot: a new fit/ folder, the snapshot's own files untouched
    attached = Path(doc["attached_to"])
    assert attached == snap.path / "fit"
    assert {"fit.json", "fit.html", "fit-batch-1.json"} <= {p.name for p in attached.iterdir()}
    assert sorted(p.name for p in snap.path.iterdir()) == sorted([*before, "fit"])
    # and `oom-sentinel snapshots show` leads with it
    lines = snapshots_show(snap.id, data, install.env).splitlines()
    assert lines[1] == f"oom-bisect fit: {doc['headline']}", lines[:3]
    print(f"\n[fit] RAM snapshot: {doc['headline']}; {doc['runs']} runs in {doc['elapsed_s']} s")
    install.assert_untouched()


@pytest.mark.slow
def test_a_real_ram_oom_is_fixed_by_a_smaller_batch(install: FitInstall) -> None:
    """Not an emulated budget: the stand-in runs under an address-space limit (300 MiB over
    what it maps at start), so batch 8 of 2048² images raises torch's CPU allocator error."""
    wf = install.workflow(
        {
            "1": {
                "class_type": "EmptyImage",
                "inputs": {"width": 2048, "height": 2048, "batch_size": 8, "color": 0},
            },
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        },
        "ram-oom",
    )
    env = dict(install.env, OOM_STANDIN_RLIMIT_AS_HEADROOM_MIB="300")
    env.pop("OOM_SENTINEL_FAKE_GPU")  # a machine without a GPU: no VRAM flag is offered
    digest = hashlib.sha256(wf.read_bytes()).hexdigest()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "oom_sentinel.bisect",
            "fit",
            "--json",
            "--workflow",
            str(wf),
            "--comfyui",
            str(install.root),
            "--python",
            sys.executable,
            "--flags",
            "--cpu",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    doc = json.loads(proc.stdout)
    assert (proc.returncode, doc["result"]) == (0, "fits"), proc.stderr[-3000:]
    assert doc["baseline"]["verdict"] == "oom" and doc["pool"] == "ram"
    assert "DefaultCPUAllocator" in doc["baseline"]["reason"]
    assert labels(doc) == [
        "disable-pinned-memory",
        "cache-lru-1",
        "cache-none",
        "disable-smart-memory",
        "batch-1",
    ]
    assert doc["recommendation"]["time_vs_baseline"] is None  # the baseline did not finish
    assert hashlib.sha256(wf.read_bytes()).hexdigest() == digest
    install.assert_untouched()


@pytest.mark.slow
def test_a_workflow_that_already_fits_is_not_a_fit_experiment(install: FitInstall) -> None:
    wf = install.workflow(blur_prompt(1), "fine")
    code, doc, _ = install.fit_workflow(wf)
    assert (code, doc["result"]) == (1, "not-reproduced")
    assert "fits unchanged" in doc["message"] and doc["trials"] == []


def _ui_blur_workflow(batch: int) -> dict[str, Any]:
    """The blur prompt as the frontend saves it (nodes, links, widgets_values)."""

    def node(nid: int, kind: str, inputs: list, outputs: list, widgets: list) -> dict[str, Any]:
        return {
            "id": nid,
            "type": kind,
            "pos": [100 * nid, 100],
            "size": [300, 120],
            "flags": {},
            "order": nid,
            "mode": 0,
            "inputs": inputs,
            "outputs": outputs,
            "properties": {"Node name for S&R": kind},
            "widgets_values": widgets,
        }

    return {
        "last_node_id": 3,
        "last_link_id": 2,
        "nodes": [
            node(
                1,
                "EmptyImage",
                [],
                [{"name": "IMAGE", "type": "IMAGE", "links": [1], "slot_index": 0}],
                [1024, 1024, batch, 0],
            ),
            node(
                2,
                "ImageBlur",
                [{"name": "image", "type": "IMAGE", "link": 1}],
                [{"name": "IMAGE", "type": "IMAGE", "links": [2], "slot_index": 0}],
                [1, 1.0],
            ),
            node(3, "PreviewAny", [{"name": "source", "type": "*", "link": 2}], [], []),
        ],
        "links": [[1, 1, 0, 2, 0, "IMAGE"], [2, 2, 0, 3, 0, "IMAGE"]],
        "groups": [],
        "config": {},
        "extra": {},
        "version": 0.4,
    }


@pytest.mark.slow
def test_a_ui_workflow_is_converted_with_the_installs_object_info(install: FitInstall) -> None:
    wf = install.workflow(_ui_blur_workflow(24), "ui")
    code, doc, err = install.fit_workflow(wf)
    assert (code, doc["result"]) == (0, "fits"), err[-3000:]
    assert "converting the UI workflow" in err
    assert doc["recommendation"]["change"]["key"] == "batch-1"
    changed = json.loads((Path(doc["report"]["dir"]) / "fit-batch-1.json").read_text())
    assert changed["1"]["class_type"] == "EmptyImage"
    assert changed["1"]["inputs"] == {"width": 1024, "height": 1024, "batch_size": 1, "color": 0}
    install.assert_untouched()


@pytest.mark.slow
def test_ctrl_c_stops_the_fit_and_its_comfyui(install: FitInstall) -> None:
    import signal
    import time

    wf = install.workflow(
        {
            "1": {"class_type": "Sleep", "inputs": {"seconds": 60.0}},
            "2": {"class_type": "AllocateVRAM", "inputs": {"mib": 500, "value": ["1", 0]}},
            "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
        },
        "sleepy",
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "oom_sentinel.bisect",
            "fit",
            "--json",
            "--workflow",
            str(wf),
            "--comfyui",
            str(install.root),
            "--python",
            sys.executable,
        ],
        env=install.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def cmdline(k: psutil.Process) -> str:
        try:  # a child may end (a zombie until reaped) between the listing and this read
            return " ".join(k.cmdline())
        except psutil.Error:
            return ""

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until its ComfyUI runs the prompt
        kids = psutil.Process(proc.pid).children(recursive=True)
        if any("main.py" in cmdline(k) for k in kids):
            break
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert json.loads(out)["result"] == "interrupted"
    install.assert_untouched()


def test_show_leads_with_the_latest_fit_attached(tmp_path: Path) -> None:
    from oom_sentinel.bisect.session.report import attach_to_snapshot
    from oom_sentinel.daemon.cli.snapshots import _fit_lead

    assert _fit_lead(tmp_path) == []
    first = attach_to_snapshot(
        tmp_path, {"fit.json": b'{"headline": "fits with --lowvram"}'}, folder="fit"
    )
    second = attach_to_snapshot(
        tmp_path, {"fit.json": b'{"headline": "fits with --novram"}'}, folder="fit"
    )
    assert (first.name, second.name) == ("fit", "fit-2")
    assert _fit_lead(tmp_path) == ["oom-bisect fit: fits with --novram"]
    (second / "fit.json").write_text("{not json")
    assert _fit_lead(tmp_path) == []  # a broken attachment is no headline, not a crash
    # the bisect's own attachments keep their name
    assert attach_to_snapshot(tmp_path, {"report.json": b"{}"}).name == "bisect"


# ---------------------------------------------------------------------------- a real ComfyUI


def _real_install(base: Path) -> Path:
    """A git install of its own made from the real checkout's files (the checkout is only read:
    its clone is sparse and lacks a blob, so it is copied, not cloned)."""
    import shutil

    src = Path(os.environ["OOM_SENTINEL_REAL_COMFYUI"])
    dest = base / "ComfyUI"
    shutil.copytree(
        src,
        dest,
        ignore=shutil.ignore_patterns(".git", "__pycache__", "output", "temp", "user", "*.db"),
        symlinks=True,
    )
    git_env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "ComfyUI v0.8.0 (copy)")):
        subprocess.run(["git", "-C", str(dest), *args], check=True, env=git_env, timeout=120)
    return dest


@pytest.mark.real_comfyui
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_real_comfyui_workflow_fits_only_at_a_smaller_batch_under_a_ram_cap(
    tmp_path: Path,
) -> None:
    """A model-free CPU workflow (comfyui-facts 7, 11) whose batch of 12 2048² images needs
    ~2 GiB of RSS on a real ComfyUI v0.8.0; under --ram-budget 1.5GiB no RAM flag helps (they
    change caching, not a single prompt's tensors), batch 1 does."""
    root = _real_install(tmp_path)
    python = os.environ.get("OOM_SENTINEL_REAL_COMFYUI_PYTHON", sys.executable)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OOM_STANDIN_", "OOM_SENTINEL_"))
    }
    env.update(OOM_SENTINEL_CACHE_DIR=str(tmp_path / "cache"), PYTHONDONTWRITEBYTECODE="1")
    inst = FitInstall(root, tmp_path, env)
    inst.before = repo_fingerprint(root)
    prompt = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 2048, "height": 2048, "batch_size": 12, "color": 0},
        },
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
    }
    wf = inst.workflow(prompt, "real")
    code, doc, err = inst.fit(
        "--workflow",
        str(wf),
        "--comfyui",
        str(root),
        "--python",
        python,
        "--flags",
        "--cpu",
        "--ram-budget",
        "1.5GiB",
        timeout=840,
    )
    assert (code, doc["result"]) == (0, "fits"), err[-4000:]
    assert doc["pool"] == "ram" and doc["baseline"]["verdict"] == "over-budget"
    tried = labels(doc)
    assert tried[-1] == "batch-1" and doc["trials"][-1]["fits"], tried
    assert not any(t["fits"] for t in doc["trials"][:-1])
    assert not any(k in ("lowvram", "novram", "reserve-vram-1.0") for k in tried)
    rec = doc["recommendation"]
    assert rec["peak_ram_bytes"] < 1.5 * GIB
    print(
        f"\n[fit] real ComfyUI: {doc['headline']}; baseline peak "
        f"{doc['baseline']['peak_ram_bytes'] / GIB:.2f} GiB; prompt {rec['prompt_s']:.2f} s vs "
        f"baseline {doc['baseline']['prompt_s']:.2f} s; {doc['runs']} runs in {doc['elapsed_s']:.1f} s"
    )
    for t in [doc["baseline"], *doc["trials"]]:
        print(
            f"  {t['label']}: {t['verdict']}, RAM {(t['peak_ram_bytes'] or 0) / GIB:.2f} GiB, "
            f"start {t['start_s']}, prompt {t['prompt_s']}"
        )
    inst.assert_untouched()
