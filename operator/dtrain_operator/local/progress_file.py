"""Reading the trainer's local progress sink (`jsonl:<path>`): one JSON record per line.

The file grows while the gang runs and across gang restarts; it is read
incrementally (a half-written last line waits for the next read).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class JsonlTail:
    """The records appended to a JSON-lines file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def skip_existing(self) -> None:
        """Read only what is appended from now on (a resumed run's file holds the earlier run's records)."""
        try:
            self._offset = self.path.stat().st_size
        except FileNotFoundError:
            self._offset = 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as stream:
                stream.seek(self._offset)
                chunk = stream.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        records = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut by a killed writer; the next record follows on its own line
            if isinstance(record, dict):
                records.append(record)
        return records
