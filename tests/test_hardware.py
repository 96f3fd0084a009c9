"""Measurements say where they were taken, and labels refuse to mix machines unless asked."""

from __future__ import annotations

import os
import re

import pandas as pd
import pyarrow as pa
import pytest

from models.tables import UNRECORDED, MixedHardwareError, labelled_records
from pipeline.config import run_stage
from pipeline.device import harness
from pipeline.core import schema as S
from pipeline.core.workspace import Workspace, write_part

from conftest import copy_workspace

OTHER = "Other CPU, 64 CPUs"


def test_measurements_and_profiles_say_where_they_were_taken(measured_workspace, collected_workspace):
    here = harness.host_identity("cpu")
    meas = Workspace(measured_workspace[0]).read("measurements")
    ok = meas[meas["error"].isna()]
    assert len(ok) and (ok["hardware"] == here["hardware"]).all() and (ok["cpu_model"] == here["cpu_model"]).all()
    assert (ok["cpu_signature"] == here["cpu_signature"]).all()
    assert (ok["cpu_count"] == os.cpu_count()).all() and ok["gpu_name"].isna().all() and ok["cache_flush"].all()
    assert ok["load_avg"].notna().all() and (ok["load_avg"] >= 0).all()
    counters = Workspace(collected_workspace[0]).read("cpu_counters", "cpu")
    assert len(counters) and (counters["hardware"] == here["hardware"]).all()


def test_a_kernel_timed_on_a_busy_host_is_told_apart():
    assert harness.timed_busy({"load_avg": 5.2, "cpu_count": 2})
    assert not harness.timed_busy({"load_avg": 1.9, "cpu_count": 2})
    # rows from before the load was recorded, or from a host without a load average
    assert not harness.timed_busy({"load_avg": None, "cpu_count": 2})
    assert not harness.timed_busy({"load_avg": float("nan"), "cpu_count": 2})
    assert not harness.timed_busy({"load_avg": 5.2, "cpu_count": None})
    assert harness.load_average() is None or harness.load_average() >= 0


def second_machine(ws: Workspace, hardware: str = OTHER, slower: float = 2.0, signature: str | None = None,
                   ) -> pd.DataFrame:
    """The workspace's good measurements as another machine took them (every latency x `slower`)."""
    meas = ws.read("measurements")
    rows = meas[meas["error"].isna()].copy()
    rows["hardware"], rows["cpu_count"], rows["cpu_signature"] = hardware, 64, signature
    for col in ("mean_s", "median_s", "min_s", "std_s"):
        rows[col] = rows[col] * slower
    rows["run_secs"] = rows["run_secs"].map(lambda xs: [x * slower for x in xs])
    with ws.writer("measurements", shard=1) as out:
        out.add(rows.to_dict("records"))
    return rows


def test_labels_refuse_two_machines_unless_asked(measured_workspace, tmp_path):
    root, over = copy_workspace(*measured_workspace, tmp_path, "runner")
    ws = Workspace(root)
    mine = labelled_records(ws)
    other = second_machine(ws)
    with pytest.raises(MixedHardwareError) as refused:
        labelled_records(ws)
    here = harness.host_identity("cpu")["hardware"]
    assert f"{here!r} ({len(mine)} records)" in str(refused.value) and f"{OTHER!r}" in str(refused.value)
    assert "train.allow_mixed_hardware=true" in str(refused.value)
    with pytest.raises(MixedHardwareError):
        run_stage("train", over)
    # Asked for: each machine's records are labelled against that machine's own best.
    both = labelled_records(ws, allow_mixed_hardware=True)
    assert len(both) == len(mine) + len(other) and set(both["hardware"]) == {here, OTHER}
    assert (both.groupby(["task_id", "hardware"])["label"].max() == 1.0).all()
    by = both.pivot_table(index="record_id", columns="hardware", values="label")
    assert ((by[here] - by[OTHER]).abs() < 1e-9).all()


def test_rows_from_before_hardware_was_recorded_read_as_null(measured_workspace, tmp_path):
    """A workspace measured by the previous code (no hardware columns) stays readable and
    counts as one machine; a new machine's rows beside it are refused."""
    root, over = copy_workspace(*measured_workspace, tmp_path, "runner", "measurements")
    ws = Workspace(root)
    new = [f.name for f in S.HOST] + ["cache_flush", "load_avg", "rounds", "round_means_s", "timer"]
    old_schema = pa.schema([f for f in S.MEASUREMENTS if f.name not in new], metadata=S.MEASUREMENTS.metadata)
    rows = Workspace(measured_workspace[0]).read("measurements")
    write_part(rows.drop(columns=new), old_schema, ws.measurements)
    back = ws.read("measurements")
    assert list(back.columns) == S.MEASUREMENTS.names and back[new].isna().all().all()
    assert (labelled_records(ws)["hardware"] == UNRECORDED).all()
    second_machine(ws)
    with pytest.raises(MixedHardwareError, match="unrecorded"):
        labelled_records(ws)


def test_the_cpu_signature_says_what_the_model_name_does_not():
    here = harness.cpu_signature()
    with open("/proc/cpuinfo") as f:
        info = f.read()
    if "vendor_id" in info and "cpu family" in info:
        assert re.fullmatch(r"\S+ family \d+ model \d+ stepping \S+", here), here
    assert harness.host_identity("cpu")["cpu_signature"] == here


def test_two_cpus_under_one_model_name_are_two_machines(measured_workspace, tmp_path):
    """A cloud VM's model name ("Intel(R) Xeon(R) Processor") can be two CPUs: rows of one
    `hardware` with two CPU signatures are refused as two machines, labelled per machine when
    asked, and a release of them is `mixed`; rows without a signature (written before it was
    recorded) beside rows with one are not refused."""
    from pipeline.core.release import hardware_of

    root, _ = copy_workspace(*measured_workspace, tmp_path, "runner")
    ws = Workspace(root)
    here = harness.host_identity("cpu")
    if here["cpu_signature"] is None:
        pytest.skip("this host's /proc/cpuinfo gives no CPU signature")
    mine = labelled_records(ws)
    second_machine(ws, hardware=here["hardware"], signature=None)  # an unknown CPU: may be this one
    assert set(labelled_records(ws)["hardware"]) == {here["hardware"]}
    other = "GenuineIntel family 6 model 1 stepping 9"
    second_machine(ws, hardware=here["hardware"], signature=other)
    with pytest.raises(MixedHardwareError) as refused:
        labelled_records(ws)
    assert f"{here['hardware']} [{other}]" in str(refused.value)
    both = labelled_records(ws, allow_mixed_hardware=True)
    assert len(set(both["hardware"])) == 3 and (both.groupby(["task_id", "hardware"])["label"].max() == 1.0).all()
    assert len(both[both["hardware"] == f"{here['hardware']} [{other}]"]) == len(mine)
    hosts = hardware_of(ws.read("measurements"))
    assert hosts["hardware"] == "mixed" and {h["cpu_signature"] for h in hosts["hosts"]} >= {other, None}


def test_a_gpus_rows_are_one_machine_whatever_cpu_hosted_it():
    from models.tables import hardware_of
    from pipeline.core.release import hardware_of as release_hardware

    cpu, gpu = "Intel(R) Xeon(R) Processor, 2 CPUs", "NVIDIA H200"
    meas = pd.DataFrame({"hardware": [gpu, gpu, cpu, cpu, cpu], "gpu_name": [gpu, gpu, None, None, None],
                         "cpu_signature": ["A", "B", "A", "B", None], "error": None})
    assert list(hardware_of(meas)) == [gpu, gpu, f"{cpu} [A]", f"{cpu} [B]", cpu]
    assert release_hardware(meas[:2])["hardware"] == gpu and release_hardware(meas[2:])["hardware"] == "mixed"
    assert release_hardware(meas[2:3])["cpu_signature"] == "A"
