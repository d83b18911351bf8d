"""Finding ComfyUI processes, parsing their launch flags, and spotting what competes with them."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_comfy_install import make_install, start_comfy, stop

from oom_sentinel.daemon.comfy.processes import (
    ComfyProcess,
    LaunchFlags,
    comfy_process_from,
    device_selection,
    find_comfy_processes,
    find_conflicts,
    looks_like_comfyui,
    other_gpu_processes,
    parse_launch_flags,
    process_exists,
    process_for,
    split_python_command,
    still_running,
)
from oom_sentinel.daemon.probes.base import GpuProcessSample
from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir, FakeProcessUsage
from oom_sentinel.daemon.probes.fake_gpu_probe import FakeGpuProbe

GiB = 1024**3

# -- launch flags (pure) ---------------------------------------------------------------------------

FLAG_CASES = [
    ("no-flags", [], LaunchFlags()),
    ("port-separate", ["--port", "8189"], LaunchFlags(port=8189, port_form="separate")),
    ("port-joined", ["--port=8190"], LaunchFlags(port=8190, port_form="joined")),
    ("listen-bare", ["--listen"], LaunchFlags(listen=("0.0.0.0", "::"))),
    (
        "listen-list",
        ["--listen", "127.0.0.1,192.168.1.5"],
        LaunchFlags(listen=("127.0.0.1", "192.168.1.5")),
    ),
    (
        "listen-bare-then-flag",
        ["--listen", "--lowvram"],
        LaunchFlags(listen=("0.0.0.0", "::"), vram_mode="lowvram", memory_args=("--lowvram",)),
    ),
    ("lowvram", ["--lowvram"], LaunchFlags(vram_mode="lowvram", memory_args=("--lowvram",))),
    (
        "last-vram-mode-wins",
        ["--highvram", "--novram"],
        LaunchFlags(vram_mode="novram", memory_args=("--highvram", "--novram")),
    ),
    ("gpu-only", ["--gpu-only"], LaunchFlags(vram_mode="gpu-only", memory_args=("--gpu-only",))),
    (
        "normalvram",
        ["--normalvram"],
        LaunchFlags(vram_mode="normalvram", memory_args=("--normalvram",)),
    ),
    ("cpu", ["--cpu"], LaunchFlags(vram_mode="cpu", memory_args=("--cpu",))),
    (
        "reserve-vram",
        ["--reserve-vram", "1.5"],
        LaunchFlags(reserve_vram_gb=1.5, memory_args=("--reserve-vram", "1.5")),
    ),
    (
        "reserve-vram-joined",
        ["--reserve-vram=2"],
        LaunchFlags(reserve_vram_gb=2.0, memory_args=("--reserve-vram", "2")),
    ),
    (
        "cuda-device",
        ["--cuda-device", "1"],
        LaunchFlags(cuda_device="1", memory_args=("--cuda-device", "1")),
    ),
    (
        "cuda-device-list",
        ["--cuda-device", "0,1"],
        LaunchFlags(cuda_device="0,1", memory_args=("--cuda-device", "0,1")),
    ),
    (
        "cache-lru",
        ["--cache-lru", "10"],
        LaunchFlags(cache_mode="lru", cache_lru_size=10, memory_args=("--cache-lru", "10")),
    ),
    ("cache-none", ["--cache-none"], LaunchFlags(cache_mode="none", memory_args=("--cache-none",))),
    (
        "cache-ram-bare",
        ["--cache-ram"],
        LaunchFlags(cache_mode="ram", cache_ram_gb=(), memory_args=("--cache-ram",)),
    ),
    (
        "cache-ram-two-values",
        ["--cache-ram", "8", "32"],
        LaunchFlags(
            cache_mode="ram", cache_ram_gb=(8.0, 32.0), memory_args=("--cache-ram", "8", "32")
        ),
    ),
    (
        "async-offload-bare",
        ["--async-offload"],
        LaunchFlags(async_offload_streams=2, memory_args=("--async-offload",)),
    ),
    (
        "async-offload-streams",
        ["--async-offload", "4"],
        LaunchFlags(async_offload_streams=4, memory_args=("--async-offload", "4")),
    ),
    (
        "memory-switches",
        [
            "--disable-smart-memory",
            "--disable-async-offload",
            "--disable-pinned-memory",
            "--disable-mmap",
            "--cpu-vae",
        ],
        LaunchFlags(
            disable_smart_memory=True,
            disable_async_offload=True,
            disable_pinned_memory=True,
            disable_mmap=True,
            cpu_vae=True,
            memory_args=(
                "--disable-smart-memory",
                "--disable-async-offload",
                "--disable-pinned-memory",
                "--disable-mmap",
                "--cpu-vae",
            ),
        ),
    ),
    (
        "cuda-malloc-off",
        ["--disable-cuda-malloc"],
        LaunchFlags(cuda_malloc=False, memory_args=("--disable-cuda-malloc",)),
    ),
    (
        "precision-and-attention",
        ["--force-fp16", "--bf16-unet", "--use-sage-attention", "--fp16-vae"],
        LaunchFlags(
            precision=("force-fp16", "bf16-unet", "fp16-vae"),
            attention="sage",
            memory_args=("--force-fp16", "--bf16-unet", "--use-sage-attention", "--fp16-vae"),
        ),
    ),
    ("fast-bare", ["--fast"], LaunchFlags(fast=(), memory_args=("--fast",))),
    (
        "fast-list",
        ["--fast", "fp16_accumulation", "autotune"],
        LaunchFlags(
            fast=("fp16_accumulation", "autotune"),
            memory_args=("--fast", "fp16_accumulation", "autotune"),
        ),
    ),
    (
        "directories",
        [
            "--user-directory",
            "/srv/u",
            "--base-directory",
            "/srv/b",
            "--output-directory",
            "/srv/o",
            "--input-directory",
            "/srv/i",
            "--temp-directory",
            "/srv/t",
            "--database-url",
            "sqlite:///:memory:",
        ],
        LaunchFlags(
            user_directory="/srv/u",
            base_directory="/srv/b",
            output_directory="/srv/o",
            input_directory="/srv/i",
            temp_directory="/srv/t",
            database_url="sqlite:///:memory:",
        ),
    ),
    (
        "extra-model-paths-repeat",
        ["--extra-model-paths-config", "a.yaml", "b.yaml", "--extra-model-paths-config", "c.yaml"],
        LaunchFlags(extra_model_paths_config=("a.yaml", "b.yaml", "c.yaml")),
    ),
    ("tls", ["--tls-keyfile", "k.pem", "--tls-certfile", "c.pem"], LaunchFlags(tls=True)),
    (
        "unknown-flags-keep-values",
        ["--frobnicate", "7", "--lowvram", "--new-flag", "--port", "8000"],
        LaunchFlags(
            port=8000,
            port_form="separate",
            vram_mode="lowvram",
            memory_args=("--lowvram",),
            unknown=("--frobnicate", "7", "--new-flag"),
        ),
    ),
    (
        "abbreviation",
        ["--lowv", "--reserve-v", "3"],
        LaunchFlags(
            vram_mode="lowvram",
            reserve_vram_gb=3.0,
            memory_args=("--lowvram", "--reserve-vram", "3"),
        ),
    ),
    ("stray-token", ["oops"], LaunchFlags(unknown=("oops",))),
    (
        "directml-bare",
        ["--directml"],
        LaunchFlags(directml=-1, memory_args=("--directml",)),
    ),
    (
        "manager-and-standalone",
        ["--windows-standalone-build", "--enable-manager", "--multi-user"],
        LaunchFlags(enable_manager=True, multi_user=True),
    ),
]


@pytest.mark.parametrize(
    ("argv", "expected"), [c[1:] for c in FLAG_CASES], ids=[c[0] for c in FLAG_CASES]
)
def test_parse_launch_flags(argv: list[str], expected: LaunchFlags) -> None:
    assert parse_launch_flags(argv) == expected


def test_bad_numbers_never_raise() -> None:
    flags = parse_launch_flags(["--port", "eighty", "--reserve-vram", "lots", "--cache-lru", "x"])
    assert flags.port is None and flags.reserve_vram_gb is None and flags.cache_lru_size is None


@pytest.mark.parametrize(
    ("argv", "url"),
    [
        ([], "http://127.0.0.1:8188"),
        (["--port", "8189"], "http://127.0.0.1:8189"),
        (["--listen"], "http://127.0.0.1:8188"),
        (["--listen", "192.168.1.5"], "http://192.168.1.5:8188"),
        (["--listen", "::"], "http://[::1]:8188"),
        (["--listen", "fd00::5", "--port", "9000"], "http://[fd00::5]:9000"),
        (["--tls-keyfile", "k", "--tls-certfile", "c"], "https://127.0.0.1:8188"),
    ],
    ids=["default", "port", "all-interfaces", "lan-address", "ipv6-any", "ipv6-address", "tls"],
)
def test_api_url_from_flags(argv: list[str], url: str) -> None:
    assert parse_launch_flags(argv).api_url() == url


# -- recognising the command line (pure) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (["python", "main.py", "--lowvram"], ("python", "main.py", ("--lowvram",))),
        (["/venv/bin/python3.11", "-s", "-u", "main.py"], ("/venv/bin/python3.11", "main.py", ())),
        (
            [
                r".\python_embeded\python.exe",
                "-s",
                r"ComfyUI\main.py",
                "--windows-standalone-build",
            ],
            (r".\python_embeded\python.exe", r"ComfyUI\main.py", ("--windows-standalone-build",)),
        ),
        (["python", "-X", "utf8", "main.py"], ("python", "main.py", ())),
        (["python", "-c", "import main"], None),
        (["python", "-m", "comfy_cli", "launch"], None),
        (["python"], None),
        (["node", "main.py"], None),
        ([], None),
    ],
    ids=[
        "plain",
        "interpreter-flags",
        "windows-portable",
        "x-option",
        "command-string",
        "module",
        "interactive",
        "not-python",
        "empty",
    ],
)
def test_split_python_command(
    cmdline: list[str], expected: tuple[str, str, tuple[str, ...]] | None
) -> None:
    assert split_python_command(cmdline) == expected


@pytest.mark.parametrize(
    ("markers", "looks"),
    [
        (("folder_paths.py",), True),
        (("comfyui_version.py",), True),
        (("comfy/", "nodes.py"), True),
        (("comfy/",), False),
        (("nodes.py",), False),
        ((), False),
    ],
    ids=[
        "folder-paths",
        "version-file",
        "comfy-and-nodes",
        "comfy-only",
        "nodes-only",
        "bare-main",
    ],
)
def test_looks_like_comfyui(tmp_path: Path, markers: tuple[str, ...], looks: bool) -> None:
    make_install(tmp_path / "c", markers=markers)
    assert looks_like_comfyui(tmp_path / "c") is looks


def test_directory_without_main_is_not_comfyui(tmp_path: Path) -> None:
    (tmp_path / "folder_paths.py").write_text("")
    assert not looks_like_comfyui(tmp_path)


def test_desktop_server_process_is_recognised() -> None:
    files = {
        "/opt/ComfyUI-Desktop/resources/ComfyUI/main.py",
        "/opt/ComfyUI-Desktop/resources/ComfyUI/folder_paths.py",
    }
    proc = comfy_process_from(
        777,
        [
            "/home/u/ComfyUI-data/.venv/bin/python",
            "/opt/ComfyUI-Desktop/resources/ComfyUI/main.py",
            "--user-directory",
            "/home/u/ComfyUI-data/user",
            "--front-end-root",
            "/opt/ComfyUI-Desktop/resources/ComfyUI/web_custom_versions/desktop_app",
            "--port",
            "8000",
        ],
        cwd="/home/u",
        exists=files.__contains__,
    )
    assert proc is not None and proc.desktop
    assert proc.code_dir == "/opt/ComfyUI-Desktop/resources/ComfyUI"
    assert proc.install_dir == "/home/u/ComfyUI-data"
    assert proc.user_dir == "/home/u/ComfyUI-data/user"
    assert proc.url == "http://127.0.0.1:8000"


def test_unreadable_environment_is_none_not_empty() -> None:
    files = {"/c/main.py", "/c/folder_paths.py"}
    proc = comfy_process_from(
        5, ["python", "main.py"], cwd="/c", environ=None, exists=files.__contains__
    )
    assert proc is not None
    assert proc.environ_readable is False
    assert proc.pytorch_cuda_alloc_conf is None and proc.cuda_visible_devices is None


@pytest.mark.parametrize(
    ("argv0", "exe", "environ", "expected"),
    [
        ("/srv/venv/bin/python", "/usr/bin/python3.11", {}, "/srv/venv/bin/python"),
        ("venv/bin/python", "/usr/bin/python3.11", {}, "/c/venv/bin/python"),
        ("python", "/usr/bin/python3.11", {"VIRTUAL_ENV": "/srv/venv"}, "/srv/venv/bin/python"),
        ("python", "/usr/bin/python3.11", {}, "/usr/bin/python3.11"),
        ("python", None, None, "python"),
    ],
    ids=["absolute-venv", "relative", "activated-venv", "bare-name", "nothing-readable"],
)
def test_interpreter_keeps_the_virtual_environment(
    argv0: str, exe: str | None, environ: dict[str, str] | None, expected: str
) -> None:
    files = {"/c/main.py", "/c/folder_paths.py"}
    proc = comfy_process_from(
        5, [argv0, "main.py"], cwd="/c", exe=exe, environ=environ, exists=files.__contains__
    )
    assert proc is not None and proc.interpreter == expected and proc.executable == exe


# -- real processes ----------------------------------------------------------------------------------


@pytest.fixture
def install(tmp_path: Path) -> Path:
    return make_install(tmp_path / "ComfyUI")


@pytest.fixture
def running(install: Path) -> Iterator[list]:  # type: ignore[type-arg]
    procs: list = []  # type: ignore[type-arg]
    yield procs
    for p in procs:
        stop(p)


def ours(found: list[ComfyProcess], *pids: int) -> dict[int, ComfyProcess]:
    return {p.pid: p for p in found if p.pid in pids}


def test_finds_a_running_comfyui_with_its_flags_and_environment(
    install: Path, running: list
) -> None:  # type: ignore[type-arg]
    proc = start_comfy(
        "main.py",
        ["--port", "8189", "--lowvram", "--reserve-vram", "2"],
        cwd=install,
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "CUDA_VISIBLE_DEVICES": "1"},
        interpreter_args=["-s"],
    )
    running.append(proc)
    found = ours(find_comfy_processes(), proc.pid)
    assert set(found) == {proc.pid}
    comfy = found[proc.pid]
    assert comfy.script == str(install / "main.py")
    assert comfy.code_dir == str(install) and comfy.install_dir == str(install)
    assert comfy.cwd == str(install)
    assert os.path.realpath(comfy.interpreter) == os.path.realpath(sys.executable)
    assert comfy.argv[-5:] == ("--port", "8189", "--lowvram", "--reserve-vram", "2")
    assert comfy.flags.port == 8189 and comfy.flags.vram_mode == "lowvram"
    assert comfy.flags.reserve_vram_gb == 2.0
    assert comfy.environ_readable
    assert comfy.pytorch_cuda_alloc_conf == "expandable_segments:True"
    assert comfy.cuda_visible_devices == "1"
    assert comfy.create_time_s is not None and comfy.ppid == os.getpid()
    assert comfy.user_dir == str(install / "user")
    assert comfy.url == "http://127.0.0.1:8189"
    assert process_exists(proc.pid) and still_running(comfy)
    assert not process_exists(proc.pid, (comfy.create_time_s or 0) - 10)  # a reused pid


def test_finds_comfyui_started_from_the_parent_directory(install: Path, running: list) -> None:  # type: ignore[type-arg]
    proc = start_comfy("ComfyUI/main.py", [], cwd=install.parent)
    running.append(proc)
    comfy = ours(find_comfy_processes(), proc.pid)[proc.pid]
    assert comfy.code_dir == str(install)
    assert comfy.pytorch_cuda_alloc_conf is None and comfy.environ_readable


def test_a_main_py_elsewhere_is_not_comfyui(tmp_path: Path, running: list) -> None:  # type: ignore[type-arg]
    other = make_install(tmp_path / "some-app", markers=())
    proc = start_comfy("main.py", [], cwd=other)
    running.append(proc)
    assert ours(find_comfy_processes(), proc.pid) == {}


def test_base_directory_is_the_install(install: Path, tmp_path: Path, running: list) -> None:  # type: ignore[type-arg]
    base = tmp_path / "data"
    base.mkdir()
    proc = start_comfy("main.py", ["--base-directory", str(base)], cwd=install)
    running.append(proc)
    comfy = ours(find_comfy_processes(), proc.pid)[proc.pid]
    assert comfy.install_dir == str(base) and comfy.code_dir == str(install)
    assert comfy.user_dir == str(base / "user")


def test_exited_process_is_gone(install: Path) -> None:
    proc = start_comfy("main.py", [], cwd=install)
    comfy = ours(find_comfy_processes(), proc.pid)[proc.pid]
    stop(proc)
    assert ours(find_comfy_processes(), proc.pid) == {}
    assert not process_exists(proc.pid) and not still_running(comfy)


def test_second_instance_on_the_same_install_and_gpu_is_flagged(
    install: Path,
    tmp_path: Path,
    running: list,  # type: ignore[type-arg]
) -> None:
    first = start_comfy("main.py", ["--port", "8188"], cwd=install)
    running.append(first)
    second = start_comfy("main.py", ["--port", "8189"], cwd=install)
    running.append(second)
    gpu = FakeGpuDir(tmp_path / "gpu").create([FakeDevice(0, "Fake RTX 4090", 24 * GiB)])
    gpu.report(FakeProcessUsage(first.pid, "python", 0, 12 * GiB, 12 * GiB))
    gpu.report(FakeProcessUsage(second.pid, "python", 0, 9 * GiB, 9 * GiB))
    gpu.report(FakeProcessUsage(os.getpid(), "pytest", 0, GiB, GiB))

    comfy = list(ours(find_comfy_processes(), first.pid, second.pid).values())
    assert len(comfy) == 2
    conflicts = {c.kind: c for c in find_conflicts(comfy, FakeGpuProbe(gpu).processes())}
    pair = tuple(sorted([first.pid, second.pid]))
    assert conflicts["same-gpu"].pids == pair and conflicts["same-gpu"].shared == "0"
    assert conflicts["same-cuda-device"].shared == "default"
    assert conflicts["same-install"].pids == pair
    assert "same-port" not in conflicts

    others = other_gpu_processes(FakeGpuProbe(gpu).processes(), [first.pid])
    assert sorted(p.pid for p in others) == sorted([second.pid, os.getpid()])


def test_instances_on_different_gpus_do_not_conflict() -> None:
    files = {"/a/main.py", "/a/folder_paths.py", "/b/main.py", "/b/folder_paths.py"}

    def make(
        pid: int, code: str, args: list[str], env: dict[str, str] | None = None
    ) -> ComfyProcess:
        proc = comfy_process_from(
            pid,
            ["python", f"{code}/main.py", *args],
            cwd="/",
            environ=env or {},
            exists=files.__contains__,
        )
        assert proc is not None
        return proc

    a = make(1, "/a", ["--cuda-device", "0"])
    b = make(2, "/b", ["--port", "8189"], {"CUDA_VISIBLE_DEVICES": "1"})
    c = make(3, "/b", ["--cpu", "--port", "8190"])
    assert device_selection(a) == "0" and device_selection(b) == "1" and device_selection(c) is None
    gpu = (GpuProcessSample(1, 0, GiB), GpuProcessSample(2, 1, GiB))
    kinds = {(k.kind, k.pids) for k in find_conflicts([a, b, c], gpu)}
    assert kinds == {("same-install", (2, 3))}


def test_same_port_is_flagged() -> None:
    files = {"/a/main.py", "/a/folder_paths.py", "/b/main.py", "/b/folder_paths.py"}
    a = comfy_process_from(1, ["python", "/a/main.py", "--cpu"], cwd="/", exists=files.__contains__)
    b = comfy_process_from(2, ["python", "/b/main.py", "--cpu"], cwd="/", exists=files.__contains__)
    assert a is not None and b is not None
    (conflict,) = find_conflicts([a, b])
    assert (conflict.kind, conflict.shared, conflict.pids) == ("same-port", "8188", (1, 2))


def test_process_for_prefers_the_install_that_also_answers_at_the_url(tmp_path: Path) -> None:
    def proc(pid: int, install: Path, *args: str) -> ComfyProcess:
        made = comfy_process_from(
            pid,
            ["/usr/bin/python3", str(install / "main.py"), *args],
            cwd=str(install),
            environ={},
            exists=lambda _p: True,
        )
        assert made is not None
        return made

    one, other = tmp_path / "ComfyUI", tmp_path / "Other"
    one.mkdir()
    other.mkdir()
    first, second, elsewhere = proc(10, one), proc(11, one, "--port", "8189"), proc(12, other)
    procs = [first, second, elsewhere]
    assert process_for(procs, path=str(one), url="http://localhost:8189") is second
    assert process_for(procs, path=str(one), url="http://127.0.0.1:9999") is first
    assert process_for(procs, path=str(one)) is first
    assert process_for(procs, path=str(tmp_path / "none"), url="http://127.0.0.1:8189") is None
    assert process_for(procs, url="http://127.0.0.1:8188") is first
    assert process_for(procs, url="http://127.0.0.1:9999") is None
