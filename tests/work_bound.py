"""A bound on work that is not a time: the Python lines a call runs, counted by a tracer.

A check whose cost a number in the input can raise is stopped as soon as it runs past its bound,
and fails the same way on any machine, however loaded. What pydantic-core does in Rust is not
counted; every validator written in Python is.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class _TooMuchWork(BaseException):
    """Raised inside the traced code: a BaseException, so that no `except Exception` (nor pydantic,
    which turns a ValueError or an AssertionError into a validation error) swallows it."""


@contextmanager
def at_most_lines(limit: int) -> Iterator[None]:
    """Fails (AssertionError) once the body has run more than `limit` lines of Python."""
    count = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
            if count > limit:
                raise _TooMuchWork
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield
    except _TooMuchWork:
        raise AssertionError(f"ran more than {limit:,} lines of Python") from None
    finally:
        sys.settrace(previous)
