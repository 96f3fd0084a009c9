"""The MetaSchedule database of a workspace: bad lines are named and skipped, and the
records can always be written back from candidates/ and measurements/ (the repair path
keeps every record)."""

from __future__ import annotations

import json
import logging
import os

import pytest

from pipeline.config import compose, run_stage
from pipeline.core import database as D
from pipeline.core import identity
from pipeline.core import schema as S
from pipeline.core.workspace import Workspace, umask, write_part

from conftest import copy_workspace
from pipeline.options import workspace_of


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
    ws = workspace_of(compose(over))
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
    ws = workspace_of(compose(over))
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


# ------------------------------------------------------- record files written by hand
# Two workloads, two candidates each, record lines as MetaSchedule writes them; no TVM.

TARGET, ARGS = {"kind": "llvm"}, [["TENSOR", "float32", [4]]]


def _trace(task: str, i: int) -> list:
    return [[["Split", [task, i]]], []]


def _line(workload: int, trace: list, run_secs=None) -> bytes:
    return json.dumps([workload, [trace, run_secs, TARGET, ARGS]], separators=(",", ":")).encode()


def _rid(task: str, trace: list) -> str:
    return identity.record_id(task, json.dumps(trace, separators=(",", ":")))


@pytest.fixture
def hand_made(tmp_path) -> Workspace:
    """Tasks t0 (workload 0) and t1 (workload 1); t0's first candidate measured at 1 and 2 s,
    t1's first failed; the others not measured."""
    ws = Workspace(tmp_path / "ws")
    ws.root.mkdir()
    ws.db_workload.write_bytes(b'["h0","{}"]\n["h1","{}"]\n')
    ws.write("tasks", [dict(task_id="t0", name="a", workload_index=0), dict(task_id="t1", name="b", workload_index=1)])
    cands = [dict(record_id=_rid(t, _trace(t, i)), task_id=t, trace_json=json.dumps(_trace(t, i)))
             for t in ("t0", "t1") for i in (0, 1)]
    write_part(cands, S.CANDIDATES, ws.candidates)
    write_part([dict(record_id=_rid("t0", _trace("t0", 0)), task_id="t0", run_secs=[1.0, 2.0]),
                dict(record_id=_rid("t1", _trace("t1", 0)), task_id="t1", error="crashed")],
               S.MEASUREMENTS, ws.measurements)
    return ws


def test_shard_record_files_are_found_beside_the_main_one(hand_made):
    ws = hand_made
    assert D.shard_record_file(ws, 0, 1) == ws.db_tuning_record
    assert D.shard_record_file(ws, 1, 3) == ws.root / "database_tuning_record.shard-1.json"
    assert D.record_files(ws) == []  # none written yet
    for name in ("database_tuning_record.shard-1.json", "database_tuning_record.shard-0.json",
                 "database_tuning_record.shard-1.json.removed", "database_tuning_record.json"):
        (ws.root / name).write_bytes(b"")
    assert D.record_files(ws) == [ws.db_tuning_record, ws.root / "database_tuning_record.shard-0.json",
                                  ws.root / "database_tuning_record.shard-1.json"]


def test_an_append_after_a_crash_keeps_the_cut_line_apart(hand_made):
    """A crash mid-write leaves a line without its end: what is appended next starts on a
    line of its own, so one bad line is lost, not the first new record with it."""
    path = hand_made.db_tuning_record
    whole = _line(0, _trace("t0", 0))
    path.write_bytes(whole + b"\n" + _line(0, _trace("t0", 1))[:20])  # line 2 cut short by the crash
    new = D.RecordLine(1, _trace("t1", 0), None, TARGET, ARGS, None, None)
    D.append_records(path, [new])
    D.append_records(path, [D.RecordLine(1, _trace("t1", 1), [0.5], TARGET, ARGS, None, None)])
    good, bad = D.read_record_lines([path])
    assert [(r.line_no, r.workload_index, r.trace) for r in good] == [
        (1, 0, _trace("t0", 0)), (3, 1, _trace("t1", 0)), (4, 1, _trace("t1", 1))]
    assert good[2].run_secs == [0.5] and good[0].raw == whole.decode()
    assert [(b.line_no, b.raw) for b in bad] == [(2, _line(0, _trace("t0", 1))[:20])]
    assert path.read_bytes().endswith(b"\n") and b"\n\n" not in path.read_bytes()


def test_sync_puts_run_times_in_keeps_foreign_lines_and_drops_duplicates(hand_made, caplog):
    """Lines spread over the main file and a shard file: each candidate's line gets the run
    times of measurements/ where it is, a line of no candidate (written by another tool)
    stays where it was, a second copy of a record goes, and a line of a workload past the
    workload file is kept aside in `.removed`."""
    ws = hand_made
    shard = D.shard_record_file(ws, 1, 2)
    foreign = _line(1, _trace("other", 0), [0.25])
    ws.db_tuning_record.write_bytes(_line(0, _trace("t0", 0)) + b"\n" + _line(0, _trace("t0", 1)) + b"\n")
    shard.write_bytes(b"\n".join([_line(1, _trace("t1", 0)), foreign, _line(1, _trace("t1", 1)),
                                  _line(0, _trace("t0", 1)), _line(7, _trace("t0", 0))]) + b"\n")
    with caplog.at_level(logging.WARNING):
        counts = D.sync_records(ws)
    # t0's first is measured (1, 2 s), t1's first failed (1e10): both lines change.
    assert counts == dict(lines=5, measured=2, updated=2, rebuilt=0, duplicates=1, removed=1)
    assert ws.db_tuning_record.read_bytes().split(b"\n") == [
        _line(0, _trace("t0", 0), [1.0, 2.0]), _line(0, _trace("t0", 1)), b""]
    assert shard.read_bytes().split(b"\n") == [
        _line(1, _trace("t1", 0), [D.FAILED_RUN_SECS]), foreign, _line(1, _trace("t1", 1)), b""]
    removed = shard.with_name(shard.name + ".removed").read_bytes()
    assert removed == (f"# {shard}:5: workload index 7 is past the 2 lines of database_workload.json\n".encode()
                       + _line(7, _trace("t0", 0)) + b"\n")
    assert D.sync_records(ws) == dict(lines=5, measured=2, updated=0, rebuilt=0, duplicates=0, removed=0)

    # fresh=True (the workload file was rebuilt): every candidate's line is written anew in
    # the main file, and the foreign line, which no candidate explains, is kept aside.
    counts = D.sync_records(ws, fresh=True)
    assert counts["lines"] == 4 and counts["removed"] == 1 and shard.read_bytes() == b""
    lines, bad = D.read_record_lines([ws.db_tuning_record])
    assert not bad and {(r.workload_index, json.dumps(r.trace)): r.run_secs for r in lines} == {
        (0, json.dumps(_trace("t0", 0))): [1.0, 2.0], (0, json.dumps(_trace("t0", 1))): None,
        (1, json.dumps(_trace("t1", 0))): [D.FAILED_RUN_SECS], (1, json.dumps(_trace("t1", 1))): None}
    assert shard.with_name(shard.name + ".removed").read_bytes().endswith(
        b"(database_workload.json was rebuilt)\n" + foreign + b"\n")
