"""Build-time resources of a record's CUDA kernels, found without a GPU.

The scheduled workload is lowered with TVM's own CUDA pipeline (the steps of
`tvm.tirx.build`) up to the device kernels. Their launch configuration (grid and block)
comes from the `thread_extent` bindings of the lowered TIR; registers, shared/constant/
local memory and spills come from `ptxas -v` on the generated CUDA source, compiled with
the flags TVM's nvcc path uses (`tvm.support.nvcc`), so the numbers are those of the
kernel that runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
_AXIS = {"blockIdx.x": "grid_x", "blockIdx.y": "grid_y", "blockIdx.z": "grid_z",
         "threadIdx.x": "block_x", "threadIdx.y": "block_y", "threadIdx.z": "block_z"}


class NvccMissing(RuntimeError):
    pass


def find_nvcc(executable: str = "nvcc") -> str:
    path = shutil.which(executable)
    if not path:
        raise NvccMissing(
            f"{executable!r} is not on PATH: CUDA resource features (ptxas -v) need the CUDA toolkit's nvcc "
            f"(install the CUDA toolkit, or set collect.nvcc=/path/to/nvcc; collect.cuda_resources=false skips them)"
        )
    return path


def device_kernels(mod, target) -> list[tuple[str, object, tuple]]:
    """(kernel name, lowered device PrimFunc, (device target, device IRModule)) per kernel."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm
    from tvm.tirx.build import split_host_device_mods

    host = "llvm" if tvm.runtime.enabled("llvm") else "c"
    bound = tvm.tirx.transform.BindTarget(target.with_host(tvm.target.Target(host)))(mod)
    pipeline, _, finalize_device = tvm.tirx.get_tir_pipeline("default")  # as tvm.compile
    _, devices = split_host_device_mods(pipeline(bound))
    out = []
    for dev_target, dev_mod in devices.items():
        dev_mod = finalize_device()(dev_mod)
        for gv, func in dev_mod.functions.items():
            name = str(func.attrs.get("global_symbol", gv.name_hint)) if func.attrs is not None else gv.name_hint
            out.append((name, func, (dev_target, dev_mod)))
    return out


def launch_config(func) -> dict:
    """grid_*/block_* of a lowered device kernel from its thread_extent bindings.

    An extent that is not a constant (dynamic shapes) is left null."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm
    import tvm_ffi

    extents: dict[str, int | None] = {}

    def on_attr(node, visitor):
        if node.attr_key == "thread_extent":
            tag = str(node.node.thread_tag)
            if tag in _AXIS:
                v = node.value
                extents[tag] = int(v.value) if isinstance(v, tvm.tirx.IntImm) else None
        return visitor.default_visit(node)

    tvm_ffi.structural_visit(func.body, [(tvm.tirx.AttrStmt, on_attr)])
    row = {_AXIS[t]: extents.get(t, 1) for t in THREAD_TAGS}
    grid = [row["grid_x"], row["grid_y"], row["grid_z"]]
    block = [row["block_x"], row["block_y"], row["block_z"]]
    row["blocks"] = None if None in grid else grid[0] * grid[1] * grid[2]
    row["threads_per_block"] = None if None in block else block[0] * block[1] * block[2]
    params = func.attrs.get("tirx.kernel_launch_params", []) if func.attrs is not None else []
    row["dynamic_shared_mem"] = any("dyn_shared" in str(p) for p in params)
    return row


def nvcc_command(nvcc: str, arch: str, source: str, output: str) -> list[str]:
    """The nvcc line of TVM's nvcc path (tvm.support.nvcc), with ptxas reporting resources."""
    try:
        from tvm.support.nvcc import _ptxas_option_flags

        ptxas = list(_ptxas_option_flags())
    except Exception:  # noqa: BLE001 - an older/newer TVM without the helper
        ptxas = ["--register-usage-level=10", "--warn-on-local-memory-usage"]
    if "-v" not in ptxas:
        ptxas.insert(0, "-v")
    return [
        nvcc, "--cubin", "-O3", "-arch", arch,
        "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
        "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math",
        f"--ptxas-options={','.join(ptxas)}", "-o", output, source,
    ]


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")


def parse_ptxas(text: str) -> dict[str, dict]:
    """Per kernel: registers, barriers, smem, cmem[0], stack frame and spills from `ptxas -v`."""
    out: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current = out.setdefault(m.group(1), {})
            continue
        if m := _PROPS.search(line):
            current = out.setdefault(m.group(1), {})
            continue
        if current is None:
            continue
        if m := _FRAME.search(line):
            current.update(local_mem_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                           spill_load_bytes=int(m.group(3)))
        if m := _USED.search(line):
            current["registers_per_thread"] = int(m.group(1))
            current["barriers"] = int(b.group(1)) if (b := _BARRIERS.search(line)) else 0
            current["shared_mem_bytes"] = int(s.group(1)) if (s := _SMEM.search(line)) else 0
            current["constant_mem_bytes"] = int(c.group(1)) if (c := _CMEM.search(line)) else None
    return out


def ptxas_resources(source: str, arch: str, nvcc: str, timeout_s: float = 300.0) -> dict[str, dict]:
    with tempfile.TemporaryDirectory(prefix="ptxas-") as d:
        src, out = os.path.join(d, "kernels.cu"), os.path.join(d, "kernels.cubin")
        with open(src, "w") as f:
            f.write(source)
        proc = subprocess.run(nvcc_command(nvcc, arch, src, out), capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        tail = [l for l in (proc.stderr or proc.stdout).splitlines() if "error" in l.lower()][:3]
        raise RuntimeError(f"nvcc exited with {proc.returncode}: {' | '.join(tail) or proc.stderr[-500:]}")
    return parse_ptxas(proc.stdout + "\n" + proc.stderr)


def record_rows(record_id: str, task_id: str, sch_mod, target, nvcc: str, timeout_s: float = 300.0) -> list[dict]:
    """One row per device kernel of a scheduled workload (raises on a lowering/compile error)."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    from tvm.tirx.build import codegen_build

    kernels = device_kernels(sch_mod, target)
    arch = str(target.attrs.get("arch", ""))
    if not arch:
        raise ValueError(f"target {target} has no `arch`: set target.tvm.arch (e.g. sm_90a)")
    sources, seen = [], set()
    for _, _, (dev_target, dev_mod) in kernels:
        if id(dev_mod) not in seen:
            seen.add(id(dev_mod))
            sources.append(codegen_build(dev_mod, dev_target).inspect_source())
    resources: dict[str, dict] = {}
    for src in sources:
        resources.update(ptxas_resources(src, arch, nvcc, timeout_s))
    rows = []
    for i, (name, func, _) in enumerate(kernels):
        row = dict(record_id=record_id, task_id=task_id, kernel_index=i, kernel_name=name, arch=arch)
        row.update(launch_config(func))
        res = resources.get(name)
        if res is None:
            row["error"] = f"ptxas reported no resources for kernel {name!r}"
        else:
            row.update(res)
        rows.append(row)
    return rows


def summary(rows: list[dict]) -> dict:
    """The `cuda.*` columns of the static program table for one record's kernel rows."""
    ok = [r for r in rows if not r.get("error")]
    if not ok:
        return {}

    def mx(key):
        vals = [r[key] for r in ok if r.get(key) is not None]
        return max(vals) if vals else None

    def sm(keys):
        vals = [sum(r.get(k) or 0 for k in keys) for r in ok]
        return sum(vals)

    return {
        "cuda.kernels": len(ok),
        "cuda.registers_per_thread_max": mx("registers_per_thread"),
        "cuda.shared_mem_bytes_max": mx("shared_mem_bytes"),
        "cuda.local_mem_bytes_max": mx("local_mem_bytes"),
        "cuda.spill_bytes_sum": sm(("spill_store_bytes", "spill_load_bytes")),
        "cuda.threads_per_block_max": mx("threads_per_block"),
        "cuda.blocks_sum": None if any(r.get("blocks") is None for r in ok) else sum(r["blocks"] for r in ok),
    }
