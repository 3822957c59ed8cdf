"""Every name the operator writes where a user reads it: a condition's type, a condition's reason, an Event's reason.

Each is declared once, beside the constant the code uses, with what it means and what to do about it:

    REASON_BACKOFF_LIMIT = reason("BackoffLimitExceeded", "the gang failed again after ...", "read ...")

The declaration returns the name itself, so the code goes on writing and comparing plain strings, and the
records are what docs/troubleshooting.md is generated from (`dtrain troubleshooting-docs`): the page lists
what the code declares, in the code's own words. A name declared twice with other words is an error at import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["condition", "reason", "event"]
EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Documented:
    """One name a user reads in `kubectl describe dtr`, and what it tells them."""

    kind: Kind
    name: str
    meaning: str
    """What it says about the job."""
    action: str
    """What the user should do ("" where nothing is to be done)."""
    event: EventType | None = None
    """A reason (or a condition's type) that is also posted as an Event of this type, with the same words."""


_DECLARED: dict[tuple[Kind, str], Documented] = {}


def _declare(record: Documented) -> str:
    known = _DECLARED.setdefault((record.kind, record.name), record)
    if known != record:
        raise ValueError(f"the {record.kind} {record.name} is declared twice, with other words")
    return record.name


def condition_type(name: str, meaning: str, action: str = "") -> str:
    """A type of status.conditions; `meaning` says what it means when True."""
    return _declare(Documented("condition", name, meaning, action))


def reason(name: str, meaning: str, action: str = "", event: EventType | None = None) -> str:
    """A reason of status.conditions (and, with `event`, of the Event posted with it)."""
    return _declare(Documented("reason", name, meaning, action, event))


def event(name: str, type_: EventType, meaning: str, action: str = "") -> str:
    """The reason of an Event posted on the DistributedTraining that no condition carries."""
    return _declare(Documented("event", name, meaning, action, type_))


def declared(kind: Kind) -> list[Documented]:
    """The records of one kind that the imported modules declared, by name."""
    return sorted((r for (k, _), r in _DECLARED.items() if k == kind), key=lambda r: r.name)
