"""Progress in a log: lines, not carriage returns; nothing for work that has nothing to do."""

from __future__ import annotations

import logging

from pipeline.compute import progress as P


def test_a_redirected_run_logs_progress_lines_and_an_empty_one_nothing(caplog, capsys, monkeypatch):
    monkeypatch.setattr(P, "LOG_INTERVAL_S", 0.0)
    with caplog.at_level(logging.INFO, logger="pipeline.progress"):
        for _ in P.progress(range(4), desc="replay", unit="kernel"):
            pass
        for _ in P.progress([], desc="measure", unit="kernel"):
            pass
        bar = P.progress(total=0, desc="collect", unit="kernel")
        bar.close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all(line.startswith("replay:") for line in lines)
    assert "4/4" in lines[-1] and not any("\r" in line for line in lines)
    assert "\r" not in capsys.readouterr().err  # pytest's stderr is no terminal: no bar drawn
