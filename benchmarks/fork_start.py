"""Start-to-ready of a real ComfyUI (``--cpu``), cold against forked from the preloaded
interpreter (``--fork-server``), alternating in the same run; prints both, the ratio, and
the RSS / VmHWM each had when it first answered ``/system_stats``.

    OOM_SENTINEL_REAL_COMFYUI=/path/to/ComfyUI \\
    OOM_SENTINEL_REAL_COMFYUI_PYTHON=/path/to/venv/bin/python \\
    .venv/bin/python benchmarks/fork_start.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fork_start import (
    PRELOAD,
    bootstrap_argv,
    clean_env,
    free_port,
    real_comfy_args,
    start,
    start_fork_server,
    stop,
)

MIB = 1024 * 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    checkout = os.environ.get("OOM_SENTINEL_REAL_COMFYUI")
    if not checkout:
        print("set OOM_SENTINEL_REAL_COMFYUI (and _PYTHON) to a ComfyUI checkout")
        return 2
    python = os.environ.get("OOM_SENTINEL_REAL_COMFYUI_PYTHON") or sys.executable
    main_py = Path(checkout) / "main.py"
    env = clean_env()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        # as the harness does: a first cold start says what ComfyUI imports (its bootstrap's
        # final report), and the server preloads those of PRELOAD
        port = free_port()
        argv = bootstrap_argv(python, tmp / "harness", main_py, real_comfy_args(tmp / "l", port))
        first = start(argv, cwd=tmp, env=env, console=tmp / "l.log", port=port, server=None)
        stop(first.proc)
        report = json.loads((tmp / "harness" / "bootstrap-report.json").read_text())
        imported = set(report.get("modules") or [])
        preload = [m for m in PRELOAD if m in imported]
        t0 = time.monotonic()
        server = start_fork_server(python, tmp / "harness", env, preload)
        preload_s = time.monotonic() - t0
        print(
            f"fork server: {len(server.preloaded)} modules preloaded in {preload_s:.2f} s "
            f"(not importable: {', '.join(sorted(server.hello.get('failed') or {})) or 'none'}), "
            f"{int(server.hello.get('file_pages') or 0) * os.sysconf('SC_PAGE_SIZE') // MIB} MiB of library pages "
            "touched by each child",
            flush=True,
        )
        rows: dict[str, list[tuple[float, int, int]]] = {"cold": [], "forked": []}
        pss_rows: dict[str, list[int]] = {"cold": [], "forked": []}
        try:
            for i in range(args.runs):
                for kind in ("cold", "forked"):
                    port = free_port()
                    run_dir = tmp / f"{kind}-{i}"
                    argv = bootstrap_argv(
                        python, tmp / "harness", main_py, real_comfy_args(run_dir, port)
                    )
                    s = start(
                        argv,
                        cwd=run_dir,
                        env=env,
                        console=run_dir / "console.log",
                        port=port,
                        server=server if kind == "forked" else None,
                    )
                    # physical memory, each page once: PSS of the process (and of the server)
                    pss = psutil.Process(s.proc.pid).memory_full_info().pss
                    if kind == "forked":
                        pss += psutil.Process(server.proc.pid).memory_full_info().pss
                    stop(s.proc)
                    rows[kind].append((s.ready_s, s.rss_bytes, s.hwm_bytes))
                    pss_rows[kind].append(pss)
                    print(
                        f"  run {i + 1} {kind:6}: ready in {s.ready_s:6.2f} s, "
                        f"RSS {s.rss_bytes / MIB:7.1f} MiB (file-backed "
                        f"{s.rss_file_bytes / MIB:6.1f}), VmHWM {s.hwm_bytes / MIB:7.1f} MiB",
                        flush=True,
                    )
        finally:
            server.close()
    cold = statistics.median(r[0] for r in rows["cold"])
    forked = statistics.median(r[0] for r in rows["forked"])
    hwm_cold = statistics.median(r[2] for r in rows["cold"])
    hwm_forked = statistics.median(r[2] for r in rows["forked"])
    print(f"start-to-ready, median of {args.runs}: cold {cold:.2f} s, forked {forked:.2f} s")
    print(f"ratio forked/cold: {forked / cold:.2f} (target <= 0.5)")
    print(
        f"VmHWM at ready, median: cold {hwm_cold / MIB:.1f} MiB, forked {hwm_forked / MIB:.1f} "
        f"MiB ({(hwm_forked - hwm_cold) / MIB:+.1f} MiB)"
    )
    pss_cold = statistics.median(pss_rows["cold"])
    pss_forked = statistics.median(pss_rows["forked"])
    print(
        f"box memory at ready (PSS), median: cold {pss_cold / MIB:.1f} MiB, forked child + "
        f"server {pss_forked / MIB:.1f} MiB ({(pss_forked - pss_cold) / MIB:+.1f} MiB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
