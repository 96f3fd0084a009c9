"""`executor=ray`: the per-item stages' jobs as tasks on a Ray cluster (see pipeline/compute/executor.py).

The driver (the `python -m pipeline` process) owns the workspace; the nodes need no
shared filesystem. Each job travels with the bytes of the files it reads (kernel
libraries are tens of KB, references a few KB) and comes back with its result and the
bytes of the files it wrote, which the driver writes into the workspace before it hands
the result to the stage; what every job of a map has (`shared`: a network, a model) goes
into Ray's object store once, and each task gets it by reference. A cpu job asks for one
CPU; a device job (timing, profiling, a tuning run) asks for `num_gpus=1` on CUDA targets,
or for one unit of a per-node custom resource on
CPU targets (`measure_resource`, declared with `ray start --resources='{"measure": 1}'`),
so that no two timings share a machine. A job with a time limit runs in a child forked
from its Ray worker (`executor.ForkedWorker`: the worker has TVM loaded already, so the
child starts at once), so a pathological build is killed and becomes an error result.

A node that is lost takes its jobs with it: Ray runs them again elsewhere
(`max_retries`), and a job whose result is still lost after that is queued again by the
driver, up to `max_retries` times, before it becomes an error result. Nothing is written
twice: the driver takes one result per job.

`address`: null starts a Ray instance on this machine for the run; `auto` joins the
cluster that `ray start` made here (or RAY_ADDRESS); `host:port` joins that head node.
An address where nothing listens fails within seconds with what to start.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.compute.executor import POLL_S, Executor, files_of, put_files, run_shipped
from pipeline.core.extras import require

log = logging.getLogger(__name__)

START_HINT = ("start the head node with `ray start --head --port=6379` (and `ray start --address=<head>:6379` on "
              "each other node, with --resources='{\"measure\": 1}' on the nodes that time kernels), or set "
              "executor.address=null to start a Ray instance on this machine for the run")


def import_ray():
    """Ray, imported on first use: a second or more to import, and not needed by
    `executor=local`."""
    return require("ray", "ray", "executor=ray")


def split_address(address: str) -> tuple[str, int]:
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise PipelineError(f"executor.address={address!r} is not host:port, auto or null")
    return host.strip("[]"), int(port)


def probe(address: str, timeout_s: float) -> None:
    """Fail at once, with what to start, when nothing listens at `address`."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        reason = "timed out" if isinstance(e, socket.timeout) else (e.strerror or type(e).__name__)
        raise PipelineError(f"executor.address={address}: no Ray cluster answers there ({reason} within "
                            f"{timeout_s:g} s): {START_HINT}") from None


def resolve(address: str | None, timeout_s: float) -> str | None:
    """The address to join (checked to answer), or None to start a local instance."""
    if address in (None, "", "local", "null"):
        return None
    if str(address) == "auto":
        # Ray's own lookup: RAY_ADDRESS, then the cluster that `ray start` recorded on this machine.
        from ray._private.services import canonicalize_bootstrap_address

        try:
            found = canonicalize_bootstrap_address("auto")
        except ConnectionError:
            raise PipelineError(f"executor.address=auto: no running Ray cluster was found on this machine "
                                f"(nor in RAY_ADDRESS): {START_HINT}") from None
        probe(found, timeout_s)
        return "auto"
    probe(str(address), timeout_s)
    return str(address)


# (address, gpu, measure resource) of the cluster this process joined, for the next stage of a run.
_JOINED: tuple | None = None


class RayExecutor(Executor):
    """Jobs as Ray tasks; see the module docstring."""

    runs_here = False

    def __init__(self, address: str | None = None, measure_resource: str = "measure", max_retries: int = 3,
                 num_cpus: int | None = None, runtime_env: dict | None = None, connect_timeout_s: float = 5.0,
                 in_flight_per_slot: int = 1, gpu: bool = False):
        self.address = None if address is None else str(address)
        self.measure_resource = str(measure_resource)
        self.max_retries = int(max_retries)
        self.num_cpus = None if num_cpus in (None, 0) else int(num_cpus)
        self.runtime_env = dict(runtime_env) if runtime_env else None
        self.connect_timeout_s = float(connect_timeout_s)
        self.in_flight_per_slot = max(1, int(in_flight_per_slot))
        self.gpu = bool(gpu)
        self.ray = None
        self.remote = None

    # ------------------------------------------------------------------ connection

    def start(self):
        global _JOINED
        if self.ray is not None:
            return self.ray
        ray = import_ray()
        key = (self.address, self.gpu, self.measure_resource)
        if ray.is_initialized() and _JOINED == key:  # the previous stage of this run joined it
            self.ray, self.remote = ray, ray.remote(run_shipped)
            return ray
        address = resolve(self.address, self.connect_timeout_s)
        if ray.is_initialized():
            ray.shutdown()
        common = dict(log_to_driver=False, logging_level=logging.WARNING, runtime_env=self.runtime_env)
        if address is None:
            # A Ray instance for this run on this machine, with the device as its measure slot.
            ray.init(address="local", num_cpus=self.num_cpus, include_dashboard=False,
                     resources=None if self.gpu else {self.measure_resource: 1}, **common)
        else:
            ray.init(address=address, **common)
        _JOINED = key
        self.ray = ray
        self.remote = ray.remote(run_shipped)
        return ray

    def close(self) -> None:
        # The connection stays for the next stage of this run (a local instance takes seconds
        # to start); Ray closes it when the process exits.
        self.ray = None

    # ------------------------------------------------------------------ scheduling

    def requirements(self, device: bool) -> dict:
        """Task options: one CPU, and the device alone for timing and profiling."""
        if not device:
            return {"num_cpus": 1}
        if self.gpu:
            return {"num_cpus": 1, "num_gpus": 1}
        return {"num_cpus": 1, "resources": {self.measure_resource: 1}}

    def slots(self, device: bool) -> int:
        """Jobs the cluster can run at once of this kind; a device kind that no node offers stops the stage."""
        total = self.ray.cluster_resources()
        if not device:
            return max(1, int(total.get("CPU", 1)))
        name = "GPU" if self.gpu else self.measure_resource
        have = int(total.get(name, 0))
        if have < 1:
            how = ("start the GPU nodes with `ray start ... --num-gpus=1` (Ray detects GPUs itself)" if self.gpu else
                   f"start the nodes that time kernels with `ray start ... --resources='{{\"{name}\": 1}}'` "
                   f"(or set executor.measure_resource to the resource they declare)")
            raise PipelineError(f"executor=ray: no node of the Ray cluster offers {name!r}, which timing and "
                                f"profiling jobs need (one per machine, so that no two timings share it): {how}")
        return have

    def describe(self, device: bool = False) -> str:
        ray = self.start()
        total = ray.cluster_resources()
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        kind = ("GPU" if self.gpu else self.measure_resource) if device else "CPU"
        return f"Ray cluster of {nodes} node(s), {int(total.get(kind, 0))} {kind} slot(s)"

    def map(self, fn, jobs, *, root, failed, device=False, timeout_s=None, shared=None):
        if not jobs:
            return
        ray = self.start()
        shared_ref = ray.put(shared) if shared else None  # once in the object store; each task gets it by reference
        options = dict(self.requirements(device), max_retries=self.max_retries, retry_exceptions=False)
        task = self.remote.options(**options)
        limit = self.slots(device) * self.in_flight_per_slot
        queue = list(range(len(jobs)))[::-1]
        tries = [0] * len(jobs)
        pending: dict = {}
        done: set[int] = set()
        while queue or pending:
            while queue and len(pending) < limit:
                i = queue.pop()
                job = jobs[i]
                pending[task.remote(fn, job, files_of(root, job.get("reads", ())), timeout_s, shared_ref)] = i
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            if ready:
                rest = [r for r in pending if r not in ready]
                ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0] if rest else []
            out = []
            for ref in ready:
                i = pending.pop(ref)
                try:
                    status, value, files = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a lost node or worker: run the job again elsewhere
                    tries[i] += 1
                    if tries[i] <= self.max_retries:
                        log.warning("job %d lost (%s); queued again (%d/%d)", i, type(e).__name__, tries[i],
                                    self.max_retries)
                        queue.append(i)
                    else:
                        out.append(failed(jobs[i], f"lost {tries[i]} times on the Ray cluster: "
                                                   f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"))
                        done.add(i)
                    continue
                if i in done:
                    continue
                done.add(i)
                if status == "done":
                    put_files(Path(root), files)
                    out.append(value)
                else:
                    out.append(failed(jobs[i], value))
            yield out
