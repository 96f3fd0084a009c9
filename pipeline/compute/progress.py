"""Progress of long work: a tqdm bar on a terminal; elsewhere (a redirected or Hydra log)
one log line every `LOG_INTERVAL_S` seconds instead of carriage returns, and nothing at
all for work that has nothing to do."""

from __future__ import annotations

import io
import logging
import sys

from tqdm import tqdm

log = logging.getLogger("pipeline.progress")

# Seconds between two progress lines in a log.
LOG_INTERVAL_S = 30.0


class LoggedBar(tqdm):
    """tqdm's meter written as a log line when tqdm would redraw it (`mininterval`)."""

    def display(self, msg=None, pos=None):
        if msg != "":  # "" clears a bar that does not stay: nothing to log
            log.info("%s", msg or self.format_meter(**self.format_dict))
        return True


def progress(iterable=None, *, total: int | None = None, **kw) -> tqdm:
    """A progress bar over `iterable` or `total` items (tqdm's keyword arguments)."""
    n = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
    if n == 0:
        return tqdm(iterable, total=total, disable=True, **kw)
    if sys.stderr.isatty():
        return tqdm(iterable, total=total, **kw)
    return LoggedBar(iterable, total=total, file=io.StringIO(), mininterval=LOG_INTERVAL_S, **kw)
