"""The MetaSchedule database of a workspace: bad lines are named and skipped, and the
records can always be written back from candidates/ and measurements/ (the repair path
keeps every record)."""

from __future__ import annotations

import logging
import os

import pytest

from pipeline.config import compose, run_stage
from pipeline.core import database as D
from pipeline.core.workspace import Workspace, umask

from conftest import copy_workspace


def records_by_id(ws: Workspace) -> dict[str, list | None]:
    """record_id -> run_secs of every line of the workspace's record files (no bad line allowed)."""
    lines, bad = D.read_record_lines(D.record_files(ws))
    assert not bad, bad
    task_of = dict(zip(ws.read("tasks")["workload_index"], ws.read("tasks")["task_id"]))
    ids = [r.record_id(task_of[r.workload_index]) for r in lines]
    assert len(ids) == len(set(ids)), "a record appears twice"
    return dict(zip(ids, (r.run_secs for r in lines)))


def expected_run_secs(ws: Workspace) -> dict[str, list | None]:
    """What the tables say each candidate's line must carry."""
    cands = ws.read("candidates").dropna(subset=["trace_json"])
    measured = D.measured_run_secs(ws)
    return {rid: measured.get(rid) for rid in cands["record_id"]}


def loads_in_metaschedule(ws: Workspace) -> int:
    from tvm.s_tir import meta_schedule as ms

    return len(ms.database.JSONDatabase(str(ws.db_workload), str(ws.db_tuning_record)).get_all_tuning_records())


def test_bad_record_lines_are_named_kept_aside_and_written_back(measured_workspace, tmp_path, caplog):
    root, over = copy_workspace(*measured_workspace, tmp_path, "runner")
    ws = Workspace(root)
    path = ws.db_tuning_record
    lines = path.read_bytes().split(b"\n")
    assert len(lines) > 8
    damaged = [lines[0], lines[1][: len(lines[1]) // 2], lines[2], b"\xff\xfe[0, not text", *lines[4:6],
               *lines[7:], lines[2]]  # line 2 cut short, line 4 not UTF-8, line 7 gone, line 3 twice
    path.write_bytes(b"\n".join(damaged))

    good, bad = D.read_record_lines([path])
    assert [str(b).split(": ", 1)[0] for b in bad] == [f"{path}:2", f"{path}:4"]
    assert "not UTF-8 text: byte 0xff at column 1" in bad[1].reason
    with caplog.at_level(logging.WARNING):
        counts = D.sync_records(ws)
    assert counts["removed"] == 2 and counts["duplicates"] == 1 and counts["rebuilt"] == 3
    assert f"{path}:4: corrupted tuning record" in caplog.text
    assert records_by_id(ws) == expected_run_secs(ws)  # every candidate, with its measured run times
    assert loads_in_metaschedule(ws) == len(expected_run_secs(ws))
    removed = path.with_name(path.name + ".removed").read_bytes()
    assert b"\xff\xfe[0, not text" in removed and f"# {path}:2: corrupted tuning record".encode() in removed

    # Written as a plain open() would (umask respected, not mkstemp's 0600), and not again
    # when nothing changed.
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask()
    before = path.stat()
    D.sync_records(ws)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_bad_line_is_skipped_by_every_stage_and_the_repair_keeps_every_record(measured_workspace, tmp_path,
                                                                                   caplog):
    """A corrupt workload line and a non-UTF-8 record line: every stage runs, names the
    line and skips what depends on it; `stage=tasks force=true` rebuilds the workload file
    and every record comes back, with its run times."""
    root, over = copy_workspace(*measured_workspace, tmp_path, "runner")
    ws = Workspace.from_cfg(compose(over))
    tasks = ws.read("tasks")
    victim = tasks.iloc[1]
    victims = set(ws.read("candidates").query("task_id == @victim.task_id")["record_id"])
    total = len(expected_run_secs(ws))
    # Its kernels and measurements are gone, so replay and measure have its records to do.
    assert ws.delete_rows("kernels", victims) == len(victims)
    ws.delete_rows("measurements", victims)
    wl = ws.db_workload.read_bytes().split(b"\n")
    wl[int(victim.workload_index)] = wl[int(victim.workload_index)][:40]
    ws.db_workload.write_bytes(b"\n".join(wl))
    rec = ws.db_tuning_record.read_bytes().split(b"\n")
    rec.insert(3, b"\x80\x81 garbage")
    ws.db_tuning_record.write_bytes(b"\n".join(rec))
    wl_line = f"{ws.db_workload}:{int(victim.workload_index) + 1}: corrupted workload line"

    with caplog.at_level(logging.WARNING):
        assert run_stage("sample", over)["new"] == 0
        assert f"{ws.db_tuning_record}:4: corrupted tuning record (not UTF-8 text" in caplog.text
        caplog.clear()
        assert run_stage("replay", over)["new"] == 0
        assert wl_line in caplog.text and f"stage=replay skips task {victim['name']}" in caplog.text
        assert run_stage("measure", over)["measured"] == 0
        caplog.clear()
        out = run_stage("collect", [*over, "collect.profiler=none"])
        assert wl_line in caplog.text and f"stage=collect skips task {victim['name']}" in caplog.text
    assert out["static"] + out["static_errors"] == total - len(victims)
    assert not victims & set(ws.read("kernels")["record_id"])
    lines = records_by_id(ws)  # the bad record line is gone from the file, its record written back
    assert len(lines) == total

    out = run_stage("tasks", [*over, "force=true"])
    assert out == {"tasks": len(tasks), "records": total}
    assert not ws.db_workload.with_name("database_workload.json.removed").exists()
    assert records_by_id(ws) == expected_run_secs(ws)
    assert loads_in_metaschedule(ws) == total
    assert run_stage("replay", over)["new"] == len(victims)
    out = run_stage("measure", over)
    assert out["measured"] + out["failed"] == len(victims) and out["measured"] > 0
    secs = records_by_id(ws)
    assert secs == expected_run_secs(ws) and all(secs[r] for r in victims)


def test_umask_is_read_without_changing_it():
    before = os.umask(0o027)
    try:
        assert umask() == 0o027
        assert umask() == 0o027
    finally:
        os.umask(before)


@pytest.mark.parametrize("text", [b"[1, 2]\n", b'["a", "b", "c"]\n', b"\xc3\x28\n"])
def test_workload_lines_that_cannot_be_read_are_none(tmp_path, text):
    ws = Workspace(tmp_path)
    ws.db_workload.write_bytes(b'["1", "x"]\n\n' + text + b'["3", "y"]\n')
    lines = D.read_workload_lines(ws)
    assert lines == [["1", "x"], None, ["3", "y"]]
    assert str(lines.bad[1]).startswith(f"{ws.db_workload}:3: corrupted workload line")


def test_force_never_deletes_the_rows_of_a_task_it_skips(measured_workspace, tmp_path, caplog):
    """A corrupt workload line makes sample, replay and collect skip its task; with
    force=true they redo every other task and leave that task's candidates, record lines,
    kernels and features as they were."""
    root, over = copy_workspace(*measured_workspace, tmp_path, "runner")
    ws = Workspace.from_cfg(compose(over))
    run_stage("collect", [*over, "collect.profiler=none"])
    tasks = ws.read("tasks")
    victim = tasks.iloc[1]
    mine = set(ws.read("candidates").query("task_id == @victim.task_id")["record_id"])
    before = {t: set(ws.read(t, columns=["record_id"])["record_id"]) for t in ("candidates", "kernels", "static")}
    lines_before = len(records_by_id(ws))
    wl = ws.db_workload.read_bytes().split(b"\n")
    wl[int(victim.workload_index)] = wl[int(victim.workload_index)][:40]
    ws.db_workload.write_bytes(b"\n".join(wl))
    over_force = [*over, "force=true"]
    with caplog.at_level(logging.WARNING):
        run_stage("sample", over_force)
        run_stage("replay", over_force)
        run_stage("collect", [*over_force, "collect.profiler=none"])
    for t, ids in before.items():
        now = set(ws.read(t, columns=["record_id"])["record_id"])
        assert mine <= now, f"force=true deleted {len(mine - now)} {t} rows of the skipped task"
        assert len(now) == len(ids), t  # sampling is seeded: the other tasks' rows come back the same
    kept = [r for r in D.read_record_lines(D.record_files(ws))[0] if r.workload_index == int(victim.workload_index)]
    assert len(kept) == len(mine) and len(records_by_id(ws)) == lines_before
    assert not ws.db_tuning_record.with_name("database_tuning_record.json.removed").exists()
