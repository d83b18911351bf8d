"""Measurements without processes, for the runner and report tests (not a test module).

``oracle(...)`` answers like the replay harness would for a history whose memory use rises at
one commit: ``Measurement`` records with an ``Ok`` peak below, an ``Oom`` (or a higher peak)
from the culprit on, and ``Skip`` for the states the test calls untestable. The real harness
is exercised in test_bisect_replay.py and test_bisect_e2e.py; these tests are about what the
step loop and the report do with its answers.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, field

from oom_sentinel.bisect.measure.replay import Measurement, Peaks
from oom_sentinel.bisect.search.verdict import Ok, Oom, Skip, Threshold
from oom_sentinel.bisect.state.states import State

MIB = 1024 * 1024


@dataclass
class Oracle:
    """``bad(state)`` decides; calls are counted; ``interrupt_at`` raises KeyboardInterrupt on
    that call (1-based) as Ctrl-C would, mid-measurement."""

    bad: Callable[[State], bool]
    skip: Callable[[State], bool] = lambda s: False
    oom: bool = False
    good_mib: float = 1000.0
    bad_mib: float = 1600.0
    interrupt_at: Container[int] = ()
    calls: list[State] = field(default_factory=list)

    def __call__(self, state: State, threshold: Threshold | None) -> Measurement:
        self.calls.append(state)
        if len(self.calls) in self.interrupt_at:
            raise KeyboardInterrupt
        if self.skip(state):
            return Measurement(Skip("won't start: exited with status 1"), Peaks())
        if self.bad(state):
            peak = int(self.bad_mib * MIB)
            if self.oom:
                return Measurement(
                    Oom("torch.OutOfMemoryError: CUDA out of memory", "gpu", peak, 500 * MIB),
                    Peaks(nvml_vram_bytes=peak, hwm_bytes=500 * MIB),
                )
        else:
            peak = int(self.good_mib * MIB)
        return Measurement(
            Ok(peak, 500 * MIB, 1.0),
            Peaks(nvml_vram_bytes=peak, hwm_bytes=500 * MIB),
            timings={"prepare_s": 0.01, "ready_s": 0.3, "prompt_s": 0.5, "teardown_s": 0.01},
        )
