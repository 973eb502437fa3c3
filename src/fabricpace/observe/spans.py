"""The context managers the user's loop enters: ``obs.step()`` and ``obs.phase()`` / ``obs.collective()``.

Kept apart from the Observer so the per-step path is easy to read in one place: entering a step
allocates nothing, and a span touches the recorder only while the observer is recording.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fabricpace.observe.observer import Observer


class StepContext:
    """Reused for every step so entering a step allocates nothing."""

    __slots__ = ("obs",)

    def __init__(self, obs: Observer) -> None:
        self.obs = obs

    def __enter__(self) -> StepContext:
        self.obs._begin_step()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.obs._end_step()
        else:
            self.obs._end_failed_step(exc_type)


class Span:
    """``obs.phase(name)`` and ``obs.collective(name, nbytes)``.

    A ``data`` phase on the event timeline (CUDA) also stamps both of its ends on the stream: the
    step's data time is then the device time between them (``Recorder.poll``), not the host
    duration, because the step span it is subtracted from is device time. Two event records per data
    phase (a few µs); nothing on the host clock, nothing for other phases. The ops row keeps the host
    span of every phase."""

    __slots__ = ("kind", "name", "nbytes", "obs", "rec", "t0")

    def __init__(self, obs: Observer, kind: str, name: str, nbytes: int) -> None:
        self.obs, self.kind, self.name, self.nbytes = obs, kind, name, nbytes
        self.rec: Any = None
        self.t0 = 0

    def __enter__(self) -> Span:
        obs = self.obs
        if obs.recording:
            if self.kind == "phase":
                self.t0 = obs.clock.now()
                if obs._data_events and self.name == "data":
                    try:
                        self.rec = obs.recorder.mark()
                    except Exception as exc:  # never into the user's loop
                        obs._fail_recording(exc)
            else:
                self.rec = obs.recorder.enter(self.kind, self.name, self.nbytes, True)
        return self

    def __exit__(self, *exc: object) -> None:
        obs = self.obs
        if not obs.recording:
            return
        if self.kind == "phase":
            rec, self.rec = self.rec, None
            if rec is not None:  # a data phase stamped on the device: its time comes from the stamps
                try:
                    obs.recorder.data_marks.append((rec, obs.recorder.mark()))
                except Exception as exc:
                    obs._fail_recording(exc)
                    return
            dur = obs.clock.now() - self.t0
            if rec is None and self.name == "data":
                obs._data_ns += dur
            obs.recorder.phase(self.name, self.t0, dur)
        elif self.rec is not None:
            obs.recorder.exit(self.rec)
