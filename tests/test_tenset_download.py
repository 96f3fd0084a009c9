"""stage=download: fails fast offline with instructions; uses, verifies and unpacks a local copy."""

from __future__ import annotations

import os
import time
import zipfile

import pandas as pd
import pytest

from pipeline.config import compose, run_stage
from pipeline.stages import download as D
from pipeline.core.release import sha256
from pipeline.tenset import dataset as DS

GPU_ID = "1jqHbmvXUrLPDCIqJIaPee_atsPc0ZFFK"


def _online() -> bool:
    import socket

    try:
        socket.create_connection(("drive.google.com", 443), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(_online(), reason="this machine reaches Google Drive: the offline path cannot be exercised")
def test_offline_download_fails_fast_with_instructions(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(D.DownloadError) as e:
        run_stage("download", ["dataset=tenset", "target=h100", f"paths.data={tmp_path}", "dataset.download.timeout_s=5"])
    assert time.monotonic() - t0 < 30
    msg = str(e.value)
    assert f"gdown https://drive.google.com/uc?id={GPU_ID}" in msg
    assert str(tmp_path / "tenset" / "dataset_gpu_v3.3.zip") in msg
    assert "dataset.path=" in msg
    # The CPU archive is the one for an llvm workspace.
    with pytest.raises(D.DownloadError, match="dataset_cpu_v3.3.zip"):
        run_stage("download", ["dataset=tenset", f"paths.data={tmp_path}", "dataset.download.timeout_s=5"])


def _zip_of(folder, dest, prefix="dataset_gpu/", extra=None):
    with zipfile.ZipFile(dest, "w") as z:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                z.write(p, prefix + str(p.relative_to(folder)))
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return dest


def test_local_zip_is_verified_unpacked_and_its_records_imported(shared_fixtures, tmp_path):
    zpath = _zip_of(shared_fixtures / "tenset", tmp_path / "dataset_gpu_v3.3.zip")
    data = tmp_path / "data"
    rec_glob = str(shared_fixtures / "ansor_records" / "*.json")
    counts = run_stage("download", ["dataset=tenset", f"dataset.path={zpath}", f"paths.data={data}",
                                    f"dataset.records.files=[{rec_glob}]"])
    assert (data / "tenset" / "dataset_gpu" / "network_info").is_dir()
    assert counts["records"] == 54 and counts["bad_lines"] == 0
    cfg = compose(["dataset=tenset", f"paths.data={data}"])
    table = pd.read_parquet(data / str(cfg.workspace) / "ansor_records.parquet")
    assert len(table) == 54 and table["record_id"].is_unique
    joined = table[table["task_id"].notna()]
    assert set(joined["source"]) >= {"matmul.json", "conv2d.json", "resnet-50-NHWC-B1-llvm.json"}
    assert table["label"].between(0, 1).all()
    # The tasks stage reads the same zip (already unpacked) and gives the joined task ids.
    run_stage("tasks", ["dataset=tenset", f"dataset.path={zpath}", f"paths.data={data}", "budget=full"])
    tasks = pd.read_parquet(data / str(cfg.workspace) / "tasks.parquet")
    assert len(tasks) == 33
    assert set(joined.loc[joined["source"] == "resnet-50-NHWC-B1-llvm.json", "task_id"]) <= set(tasks["task_id"])


def test_verify_records_checks_sha256_size_and_crcs(tmp_path):
    from omegaconf import OmegaConf

    (tmp_path / "empty").mkdir()
    z = _zip_of(tmp_path / "empty", tmp_path / "a.zip", extra={"dataset_gpu/x.txt": "hello"})
    spec = OmegaConf.create({"file": "a.zip", "gdrive_id": "x", "sha256": None, "size_bytes": None})
    digest = D.verify(spec, z)
    assert (tmp_path / "a.zip.sha256").read_text().split()[0] == digest == sha256(z)
    assert D.verify(spec, z) == digest  # checked against the recorded value from now on
    spec.sha256 = "0" * 64
    with pytest.raises(D.DownloadError, match="does not match"):
        D.verify(spec, z)
    spec.sha256, spec.size_bytes = None, 1
    with pytest.raises(D.DownloadError, match="bytes, expected 1"):
        D.verify(spec, z)
    # A corrupted member fails its CRC.
    raw = bytearray(z.read_bytes())
    raw[raw.find(b"hello")] ^= 0xFF
    bad = tmp_path / "bad.zip"
    bad.write_bytes(bytes(raw))
    with pytest.raises(DS.DatasetError, match="CRC"):
        DS.check_zip(bad)


def test_unpack_refuses_members_outside_the_destination(tmp_path):
    z = tmp_path / "evil.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("../outside.txt", "x")
    with pytest.raises(DS.DatasetError, match="outside"):
        DS.unpack(z, tmp_path / "dest")
    assert not (tmp_path / "outside.txt").exists()


def test_other_datasets_have_nothing_to_download(tmp_path):
    assert run_stage("download", [f"paths.data={tmp_path}"]) == {}


def _hostile_zip(path, how: str):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        if how == "bomb":
            z.writestr("dataset_gpu/big.json", b"\0" * (64 << 20))  # 64 MiB of zeros: ~64 KiB compressed
        elif how == "total":
            for i in range(3):  # incompressible: within the ratio bound, over the total one
                z.writestr(f"dataset_gpu/part{i}.json", os.urandom(2 << 20))
        elif how == "symlink":
            info = zipfile.ZipInfo("dataset_gpu/link")
            info.external_attr = (0o120777 << 16)
            z.writestr(info, "/etc/passwd")
        elif how == "clash":
            z.writestr("dataset_gpu/a", b"file")
            z.writestr("dataset_gpu/a/b.json", b"{}")
        elif how == "traversal":
            z.writestr("../outside.json", b"{}")


@pytest.mark.parametrize("how, says", [
    ("bomb", "inflates .*-fold"), ("total", "unpack to 0.0 GiB, over the bound of 0 GiB"), ("symlink", "symbolic link"),
    ("clash", "needs a folder where another member is a file"), ("traversal", "points outside"),
])
def test_hostile_archives_are_refused_before_anything_is_unpacked(tmp_path, how, says):
    archive = tmp_path / f"{how}.zip"
    _hostile_zip(archive, how)
    dest = tmp_path / "tenset"
    bound = {"max_bytes": 4 << 20} if how == "total" else {}
    with pytest.raises(DS.DatasetError, match=says) as e:
        DS.unpack(archive, dest, **bound)
    assert str(archive) in str(e.value) and "paths.data" not in str(e.value)
    assert not dest.exists() and not (tmp_path / "outside.json").exists()
