"""Seed secrets everywhere a snapshot takes data from; none may reach the disk or the export."""

from __future__ import annotations

import zipfile
from dataclasses import replace
from pathlib import Path

import snapshot_samples as samples

from oom_sentinel.daemon.incidents.snapshot import (
    InstanceInfo,
    SnapshotContent,
    export_snapshot,
    load_snapshot,
    validate_snapshot_json,
    write_snapshot,
)
from oom_sentinel.daemon.incidents.tracker import Observation
from oom_sentinel.daemon.probes.base import GpuProcessSample

# Each value is unique, so finding any part of it on disk means it leaked.
SECRETS = {
    "hf": "hf_SeedHuggingFaceToken0123456789abcd",
    "openai": "sk-proj-SeedOpenAiKey0123456789abcdef",
    "github": "ghp_SeedGithubToken0123456789abcdefghij",
    "github_pat": "github_pat_11SEEDPAT0123456789_abcdefghijklmnop",
    "aws": "AKIASEEDAWSKEY012345",
    "slack": "xoxb-5555555555-SeedSlackToken",
    "telegram": "987654321:AAHSeedTelegramBotToken0123456789ab",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzZWVkIjoiand0In0.SeedJwtSignature0123456789",
    "comfy_key": "comfyui-seed-api-key-0001",
    "comfy_token": "seed-comfy-auth-token-0002",
    "civitai": "seedcivitai0123456789abcdef012345",
    "password": "seed-Pa55word-0003",
    "url_pass": "seed-url-pass-0004",
    "query_token": "seed-query-token-0005",
    "query_sig": "seed-query-sig-0006",
    "bearer": "SeedBearerToken0123456789",
    "discord": "SeedDiscordWebhookSecret-0007",
    "argv": "seed-argv-secret-0008",
    "node_input": "seed-node-api-key-0009",
    "cookie": "seed-cookie-0010",
    "env_secret": "seed-env-secret-0011",
    "pem": "SEEDPEMBODY0012",
}
S = SECRETS

LOG = (
    samples.LOG_TEXT
    + f"[2026-01-02 10:11:12.300] HF_TOKEN={S['hf']} OPENAI_API_KEY={S['openai']}\n"
    + f"fetching https://bob:{S['url_pass']}@models.example.com/x.safetensors"
    + f"?token={S['query_token']}&sig={S['query_sig']}\n"
    + f"Authorization: Bearer {S['bearer']}\n"
    + f"posting to https://discord.com/api/webhooks/1234567890/{S['discord']}\n"
    + f"git remote https://{S['github']}@github.com/a/b\n"
    + f"telegram bot {S['telegram']} and slack {S['slack']} jwt {S['jwt']}\n"
    + f"-----BEGIN PRIVATE KEY-----\n{S['pem']}\n-----END PRIVATE KEY-----\n"
)


def seeded_content() -> SnapshotContent:
    base = samples.content()
    incident = base.incident
    seeded_obs = (
        *tuple(
            replace(
                o,
                evidence={
                    **o.evidence,
                    "request_headers": {
                        "Authorization": f"Bearer {S['bearer']}",
                        "Cookie": S["cookie"],
                    },
                    "url": f"https://api.example.com/v1?api_key={S['openai']}",
                },
            )
            for o in incident.observations
        ),
        Observation(
            "main",
            "api",
            replace(incident.event, message=f"failed with key {S['github_pat']}"),
            incident.first_seen_s,
            {
                "extra_data": {
                    "api_key_comfy_org": S["comfy_key"],
                    "auth_token_comfy_org": S["comfy_token"],
                }
            },
        ),
    )
    memory = base.memory
    assert memory is not None
    memory = replace(
        memory,
        gpu_processes=(
            *memory.gpu_processes,
            GpuProcessSample(
                pid=4343,
                device_index=0,
                used_bytes=1,
                name="uploader",
                cmdline=("uploader", "--api-key", S["argv"], f"--token={S['aws']}"),
            ),
        ),
    )
    prompt = {
        **samples.PROMPT,
        "9": {"class_type": "SomeCloudNode", "inputs": {"api_key": S["node_input"], "seed": 1}},
    }
    workflow = {
        **samples.WORKFLOW,
        "extra": {"civitai_api_key": S["civitai"], "note": f"my password: {S['password']}"},
    }
    return replace(
        base,
        incident=replace(incident, observations=seeded_obs),
        instance=InstanceInfo(
            "main", "/opt/ComfyUI", f"http://admin:{S['password']}@127.0.0.1:8188"
        ),
        memory=memory,
        log_text=LOG,
        timeline_csv=samples.TIMELINE_CSV + f"# note HF_TOKEN={S['hf']}\n",
        prompt=prompt,
        workflow=workflow,
        sections={
            "process": {
                "argv": ["python", "main.py", "--api-key", S["argv"]],
                "env": {
                    "HF_TOKEN": S["hf"],
                    "CIVITAI_API_KEY": S["civitai"],
                    "MY_APP_SECRET": S["env_secret"],
                    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                },
            },
            "system_stats": {"system": {"argv": ["main.py", f"--token={S['aws']}"]}},
        },
    )


def assert_clean(blob: bytes, where: str) -> None:
    text = blob.decode("utf-8", "replace")
    for name, secret in SECRETS.items():
        assert secret not in text, f"{name} leaked into {where}"
        # no sizeable fragment either (e.g. the tail of a partially matched token)
        assert secret[-10:] not in text, f"part of {name} leaked into {where}"


def test_no_seeded_secret_survives_anywhere_on_disk(tmp_path: Path) -> None:
    ref = write_snapshot(tmp_path / "snapshots", seeded_content())
    files = [p for p in (tmp_path / "snapshots").rglob("*") if p.is_file()]
    assert {p.name for p in files} == {
        "snapshot.json",
        "log.txt",
        "timeline.csv",
        "prompt.json",
        "workflow.json",
    }
    for path in files:
        assert_clean(path.read_bytes(), path.name)
    # still a valid, useful snapshot
    snap = load_snapshot(ref.path)
    assert validate_snapshot_json(snap.data) is None
    assert snap.data["process"]["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert snap.data["instance"]["url"] == "http://[REDACTED]@127.0.0.1:8188"
    assert "CUDA out of memory" in (ref.path / "log.txt").read_text()

    out = tmp_path / "export.zip"
    export_snapshot(snap, out)
    with zipfile.ZipFile(out) as zf:
        for name in zf.namelist():
            assert_clean(zf.read(name), f"export.zip:{name}")
