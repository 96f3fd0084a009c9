"""The local executor and the shipping of jobs to machines without the workspace."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pipeline.compute.executor import LocalExecutor, run_shipped


def failed(job, reason):
    return {"name": job["name"], "error": reason}


def test_local_pool_turns_timeouts_and_crashes_into_error_results(tmp_path):
    # Lambdas travel by value (cloudpickle), so the pool's workers need nothing of this module.
    def work(job, root):  # one function for all three: the job says what it does
        if job["name"] == "crash":
            os._exit(3)
        if job["name"] == "hang":
            time.sleep(60)
        (Path(root) / job["writes"][0]).write_text(job["name"])
        return {"name": job["name"], "error": None}

    jobs = [dict(name=n, writes=[f"out/{n}.txt"]) for n in ("ok", "crash", "hang", "ok2")]
    (tmp_path / "out").mkdir()
    with LocalExecutor(workers=2) as executor:
        results = [r for batch in executor.map(work, jobs, root=tmp_path, failed=failed, timeout_s=5.0)
                   for r in batch]
    by_name = {r["name"]: r["error"] for r in results}
    assert len(results) == 4 and by_name["ok"] is None and by_name["ok2"] is None
    assert by_name["crash"].startswith("worker process crashed")
    assert by_name["hang"] == "timeout: not finished within 5 s"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ok.txt", "ok2.txt"]


def test_device_jobs_run_here_one_at_a_time(tmp_path):
    order = []

    def work(job, root):
        order.append(job["name"])
        if job["name"] == "bad":
            raise RuntimeError("no device")
        return {"name": job["name"], "error": None}

    jobs = [dict(name=n) for n in ("a", "bad", "b")]
    batches = list(LocalExecutor(workers=2).map(work, jobs, root=tmp_path, failed=failed, device=True))
    assert order == ["a", "bad", "b"] and [len(b) for b in batches] == [1, 1, 1]
    assert batches[1] == [{"name": "bad", "error": "RuntimeError: no device"}]


def test_a_shipped_job_gets_its_files_and_brings_back_what_it_wrote():
    def work(job, root):
        text = (Path(root) / "lib/in.txt").read_text()
        (Path(root) / "lib/out.txt").write_text(text.upper())
        return len(text)

    job = dict(reads=["lib/in.txt"], writes=["lib/out.txt", "lib/never.txt"])
    status, result, back = run_shipped(work, job, {"lib/in.txt": b"kernel"}, None)
    assert (status, result, back) == ("done", 6, {"lib/out.txt": b"KERNEL"})
    status, reason, back = run_shipped(lambda job, root: time.sleep(30), job, {}, 1.0)
    assert (status, reason, back) == ("failed", "timeout: not finished within 1 s", {})
    status, reason, back = run_shipped(lambda job, root: os._exit(3), job, {}, 5.0)
    assert (status, reason, back) == ("failed", "worker process crashed (exit code 3)", {})
    status, reason, back = run_shipped(lambda job, root: 1 / 0, job, {}, 5.0)
    assert (status, back) == ("failed", {}) and reason.startswith("ZeroDivisionError")
    # a timed job's child wrote its files into the job's folder: they come back as without a limit
    status, result, back = run_shipped(work, job, {"lib/in.txt": b"kernel"}, 5.0)
    assert (status, result, back) == ("done", 6, {"lib/out.txt": b"KERNEL"})
