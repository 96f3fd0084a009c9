"""The events files: a `start` line before each kernel and a `done` line after it, appended
and flushed at once, read back whole or as they come (a line cut by a crash is skipped)."""

from __future__ import annotations

import json
from pathlib import Path


def read_events(path: Path, bad: list | None = None) -> list[dict]:
    """Every event of an events file. A line that is not a JSON object (cut by a crash, or
    damaged bytes) is skipped; with `bad`, its `(line number, reason)` is appended there."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for i, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
            if not isinstance(event, dict):
                raise ValueError("not a JSON object")
            out.append(event)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            if bad is not None:
                bad.append((i, f"{type(e).__name__}: {e}"[:200]))
    return out


def done_events(path: Path, bad: list | None = None) -> dict[str, dict]:
    """record_id -> its (last) `done` event."""
    return {ev["record_id"]: ev for ev in read_events(path, bad) if ev.get("event") == "done" and "record_id" in ev}


class EventTail:
    """The events appended to a file since the last look (whole lines only)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.size = Path(path), 0, 0

    def skip_existing(self) -> "EventTail":
        self.offset = self.size = self.path.stat().st_size if self.path.exists() else 0
        return self

    def new(self) -> list[dict]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.size = self.offset + len(data)
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                event = json.loads(line)
            except ValueError:  # damaged bytes: read_events names the line
                continue
            if isinstance(event, dict):
                out.append(event)
        return out


def append_event(path: Path, event: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(event) + "\n")
