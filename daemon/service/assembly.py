"""Snapshot assembly: one incident, plus what the other stages know about it (the memory
timeline, the prompt and its process from the prompt lifecycle, the log lines around its
record, the install state), becomes a ``SnapshotContent`` -- which ``snapshot.write_snapshot``
persists. Nothing here writes; the incident actions stage calls ``assemble`` and writes."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from oom_sentinel.daemon.classify.advice import AdviceContext, ComfyInstance, GpuProcess, advise
from oom_sentinel.daemon.comfy.process_watch import kernel_section, process_section
from oom_sentinel.daemon.comfy.processes import (
    ComfyProcess,
    find_comfy_processes,
    other_gpu_processes,
    process_exists,
    shares_gpu,
)
from oom_sentinel.daemon.incidents.snapshot import (
    HostFacts,
    SnapshotContent,
    collect_host_facts,
    iso_utc,
)
from oom_sentinel.daemon.incidents.tracker import FoldedRecord, Incident
from oom_sentinel.daemon.install.history import InstallStateTracker
from oom_sentinel.daemon.probes.base import GpuProcessSample, MemorySample
from oom_sentinel.daemon.probes.timeline import Sampler, Timeline, to_csv
from oom_sentinel.daemon.service.instances import WatchedInstance
from oom_sentinel.daemon.service.prompts import PromptLifecycle


def advice_context(
    proc: ComfyProcess | None,
    *,
    gpu_processes: Sequence[GpuProcessSample] = (),
    own_pids: Sequence[int] = (),
    comfy_processes: Sequence[ComfyProcess] = (),
    memory: MemorySample | None = None,
    system_stats: Mapping[str, Any] | None = None,
) -> AdviceContext:
    """What advice can use beyond the message -- other GPU users, second instances that share
    the GPU (``processes.shares_gpu``, the rule the snapshot's process section and doctor
    use), launch flags, totals -- from the same typed values the process section is built
    from."""
    own = {*own_pids, *((proc.pid,) if proc is not None else ())}
    other_comfy = [p for p in comfy_processes if proc is None or p.pid != proc.pid]
    comfy_pids = {p.pid for p in other_comfy}
    others = tuple(
        GpuProcess(pid=gp.pid, name=gp.name, bytes=gp.used_bytes)
        for gp in other_gpu_processes(gpu_processes, own)
        if gp.pid not in comfy_pids
    )
    gpu_by_pid: dict[int, int] = {}
    for gp in gpu_processes:
        if gp.used_bytes is not None:
            gpu_by_pid[gp.pid] = gpu_by_pid.get(gp.pid, 0) + gp.used_bytes
    instances = tuple(
        ComfyInstance(pid=p.pid, port=p.flags.effective_port, bytes=gpu_by_pid.get(p.pid))
        for p in other_comfy
        if shares_gpu(proc, p, gpu_processes)
    )
    total_vram = None
    total_ram = None
    if memory is not None:
        totals = [g.total_bytes for g in memory.gpus if g.total_bytes is not None]
        total_vram = max(totals) if totals else None
        total_ram = memory.host.ram_total_bytes if memory.host is not None else None
    raw_system = (system_stats or {}).get("system")  # ComfyUI's /system_stats: its JSON
    system: Mapping[str, Any] = raw_system if isinstance(raw_system, Mapping) else {}
    return AdviceContext(
        other_gpu_processes=others,
        other_instances=instances,
        launch_flags=tuple(proc.flags.memory_args) if proc is not None else (),
        total_vram_bytes=total_vram,
        total_ram_bytes=total_ram,
        platform=system.get("os") if isinstance(system.get("os"), str) else sys.platform,
        alloc_conf=proc.pytorch_cuda_alloc_conf if proc is not None else None,
    )


@dataclass(frozen=True)
class Assembled:
    """A snapshot's content, and what the writer reports beside it."""

    content: SnapshotContent
    #: the install-state tracker's summary tail ("suspected regression ...") when it has one
    summary_suffix: str | None

    @property
    def regression_suspected(self) -> bool:
        regression = self.content.sections.get("regression") or {}
        return regression.get("suspected") is True


class SnapshotAssembler:
    """Builds ``SnapshotContent`` for an incident; main loop only."""

    def __init__(
        self,
        prompts: PromptLifecycle,
        log_text: Callable[[Incident], str],
        *,
        clock: Callable[[], float],
        sampler: Sampler | None = None,
        timeline: Timeline | None = None,
        install_states: InstallStateTracker | None = None,
    ) -> None:
        self.prompts = prompts
        self.log_text = log_text
        self.clock = clock
        self.sampler = sampler
        self.timeline = timeline
        self.install_states = install_states
        self._host_facts: HostFacts | None = None

    def assemble(
        self, incident: Incident, inst: WatchedInstance, records: Sequence[FoldedRecord]
    ) -> Assembled:
        memory = self.sampler.sample_once() if self.sampler is not None else None
        if memory is None and self.timeline is not None:
            memory = self.timeline.latest()
        timeline_csv = to_csv(self.timeline.snapshot()) if self.timeline is not None else ""
        if self._host_facts is None:
            self._host_facts = collect_host_facts()
        captured, exit = self.prompts.evidence_of(incident)
        sections: dict[str, Mapping[str, Any]] = {}
        proc = exit.process if exit is not None else inst.process
        gpu_procs = tuple(memory.gpu_processes) if memory is not None else ()
        own: set[int] = set()
        if proc is not None and exit is None:
            with contextlib.suppress(psutil.Error, OSError):
                own.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
        try:
            comfy = [p for p in find_comfy_processes() if process_exists(p.pid, p.create_time_s)]
        except Exception:
            comfy = []
        sections["process"] = process_section(
            proc, gpu_processes=gpu_procs, own_pids=own, comfy_processes=comfy, exit=exit
        )
        if exit is not None:
            sections["kernel"] = kernel_section(exit.death, exit.evidence, exit.basis)
        done = captured.done if captured is not None else None
        context = self.prompts.api_context.get(incident.instance)
        stats = done.system_stats if done is not None and done.system_stats else None
        logs = done.internal_logs if done is not None and done.internal_logs else None
        stats_at = logs_at = done.seen_s if done is not None else None
        if stats is None and context is not None and context.system_stats is not None:
            stats, stats_at = context.system_stats, context.at_s
        if logs is None and context is not None and context.internal_logs is not None:
            logs, logs_at = context.internal_logs, context.at_s
        if stats is not None:
            sections["system_stats"] = {
                "captured": iso_utc(stats_at) if stats_at else None,
                **dict(stats),
            }
        if logs is not None:
            sections["internal_logs"] = {
                "captured": iso_utc(logs_at) if logs_at else None,
                "lines": logs.count("\n"),
                "tail": logs,
            }
        prompt = captured.prompt if captured is not None else None
        workflow = captured.workflow if captured is not None else None
        context_in = advice_context(
            proc,
            gpu_processes=gpu_procs,
            own_pids=sorted(own),
            comfy_processes=comfy,
            memory=memory,
            system_stats=stats,
        )
        advice = advise(incident.event, context_in)
        parts = None
        if self.install_states is not None:
            parts = self.install_states.snapshot_parts(
                incident.instance,
                prompt=prompt,
                started_s=incident.first_seen_s,
                process_start_s=inst.process.create_time_s if inst.process else None,
            )
        if parts is not None:
            sections.update(parts.sections)
            advice = [parts.advice, *advice] if parts.advice is not None else advice
        suffix = parts.summary_suffix if parts is not None else None
        content = SnapshotContent(
            incident=dataclasses.replace(incident, summary=incident.summary + suffix)
            if suffix
            else incident,
            instance=inst.info(),
            host=self._host_facts,
            created_s=self.clock(),
            advice=tuple(advice),
            memory=memory,
            log_text=self.log_text(incident),
            timeline_csv=timeline_csv,
            prompt=prompt,
            workflow=workflow,
            sections=sections,
            records=tuple(records),
        )
        return Assembled(content, suffix)
