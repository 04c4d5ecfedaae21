"""What the wizard reports while it works: one WizardEvent per start, progress, warning and end of a step."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Callable, Protocol


class Step(StrEnum):
    INVENTORY = "inventory"
    SELECT = "select"
    S3 = "s3"
    SYSINFO = "sysinfo"
    DOWNLOAD = "download"
    NOTES = "notes"
    VERDICT = "verdict"


class EventKind(StrEnum):
    START = "start"
    PROGRESS = "progress"
    INFO = "info"
    WARNING = "warning"
    DONE = "done"


class Unit(StrEnum):
    """Of an event's done/total."""

    BYTES = "bytes"
    FILES = "files"


class Payload(Protocol):
    """A record an event carries (the inventory summary, the selection, the verdict, ...)."""

    def to_json(self) -> dict: ...


@dataclass(frozen=True)
class S3Listed:
    """The S3 step's end: objects listed under the prefix, and how many files matched how (in match order)."""

    objects: int
    matches: tuple[tuple[str, int], ...]

    def to_json(self) -> dict:
        return {"objects": self.objects, "matches": dict(self.matches)}


@dataclass(frozen=True)
class NotesWritten:
    safe: bool

    def to_json(self) -> dict:
        return {"safe": self.safe}


@dataclass(frozen=True)
class WizardEvent:
    step: Step
    kind: EventKind
    message: str = ""
    done: int | None = None
    total: int | None = None
    unit: Unit | None = None
    rate: float | None = None  # bytes/s
    data: Payload | None = None

    def to_json(self) -> dict:
        out: dict[str, object] = {"step": self.step, "kind": self.kind, "message": self.message}
        for key, value in (("done", self.done), ("total", self.total), ("unit", self.unit), ("rate", self.rate)):
            if value is not None:
                out[key] = value
        if self.data is not None:
            out["data"] = self.data.to_json()
        return out


OnEvent = Callable[[WizardEvent], None]


class Emitter:
    """Sends WizardEvents to one callback (or nowhere)."""

    def __init__(self, on_event: OnEvent | None):
        self.on_event = on_event

    def __call__(self, step: Step, kind: EventKind, message: str = "", *, done: int | None = None,
                 total: int | None = None, unit: Unit | None = None, rate: float | None = None,
                 data: Payload | None = None) -> None:
        if self.on_event is not None:
            self.on_event(WizardEvent(step, kind, message, done, total, unit, rate, data))
