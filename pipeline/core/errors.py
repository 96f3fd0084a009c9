"""Errors a user can fix: the entry point prints them without a traceback."""


class PipelineError(RuntimeError):
    """Bad input or a missing prerequisite; the message names the input and the fix."""
