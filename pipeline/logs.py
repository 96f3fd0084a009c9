"""The console and Hydra's job log hold the same lines; dependencies' chatter stays out.

Hydra's job logging (conf/config.yaml, `hydra.job_logging`) sends log records to the
console and to `<output dir>/<job>.log`. What the stages print (tables, the summary) is
turned into records of the `pipeline.console` logger while a stage runs (`console_to_log`):
that logger's console handler shows the bare line, as print did, and the log file gets it
with a time stamp. Progress bars (tqdm, on stderr) stay on the console only. A record with a
traceback is one line on the console (`ConsoleFormatter`); the log file holds the traceback.

`quiet_dependencies` holds the loggers named in `log.quiet` at WARNING (MLflow's model
loading and artifact notes, alembic's migrations, numexpr's thread count, TVM's notes) and
turns MLflow's artifact download bars off; `log.quiet=[]` shows them all again. MLflow
is told not to install its own stderr handler (MLFLOW_CONFIGURE_LOGGING=false): its
records then reach the log file too.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from typing import Iterable, Iterator

CONSOLE = logging.getLogger("pipeline.console")


class LineLogger(io.TextIOBase):
    """A text stream whose every line becomes an INFO record of `logger`."""

    def __init__(self, logger: logging.Logger):
        self.logger, self.pending = logger, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        lines = (self.pending + text).split("\n")
        self.pending = lines.pop()
        for line in lines:
            self.logger.info("%s", line)
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.logger.info("%s", self.pending)
            self.pending = ""


@contextlib.contextmanager
def console_to_log() -> Iterator[None]:
    """What is printed in the block goes to the console and the job's log file, line by line."""
    if not CONSOLE.handlers:  # not under Hydra's job logging (tests, a library call): print as is
        yield
        return
    stream = LineLogger(CONSOLE)
    try:
        with contextlib.redirect_stdout(stream):
            yield
    finally:
        stream.flush()


class ConsoleFormatter(logging.Formatter):
    """The console's format: a record without its traceback, which stays in the job's log file
    (a failing cost model or job is one line on the console, its trace where it can be read
    in full). The record is left as it was for the file handler."""

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        if not (record.exc_info or record.stack_info):
            return super().format(record)
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            return super().format(record) + " (traceback in the job's log file)"
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


def quiet_dependencies(names: Iterable[str]) -> None:
    """Hold the loggers `names` (and their children) at WARNING; MLflow without its bars."""
    names = [str(n) for n in names]
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
    if "mlflow" in names:
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for name in names:
        logging.getLogger(name).setLevel(logging.WARNING)
