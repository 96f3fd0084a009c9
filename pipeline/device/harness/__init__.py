"""The kernel harness: load exported kernels, make seeded inputs, run them under an
instrument, write start/done events; and the supervisor that isolates crashes and hangs.

This package is self-contained (Python's standard library, NumPy, the TVM runtime; `nvtx`
only for the NVTX instrument; its modules import one another and no project module) so
that a bundle ships it whole, as `harness/`, to a GPU host with a runtime-only TVM
(`TVM_USE_RUNTIME_LIB=1`) that runs it on shipped artifacts:

    python -m harness --jobs jobs.jsonl --out events.jsonl --instrument timer --device cuda

Its rooms: `lifetime` (child processes that die with their parent, timeouts, exit codes),
`host` (where kernels run), `events` (the events files), `instruments` (inputs, checks,
timer/nvtx/perf, the in-process loop), `supervisor` (crash and hang isolation, rounds) and
`cli` (the command line).

jobs.jsonl: one JSON object a line: `record_id`, `artifact` (path relative to --root),
`args` ([[dtype, shape], ...]) and optionally `reference` (.npz relative to --root: the
seed of the inputs and sampled outputs of the unscheduled workload).
events.jsonl: a `start` line before each kernel and a `done` line after it (with `error`
when the kernel failed, crashed the process or ran past --timeout-s), flushed at once.
Every `done` line says where it ran (`hardware`, `cpu_model`, `cpu_count`, `gpu_name`,
`gpu_driver`: read from /proc/cpuinfo, the TVM device and `nvidia-smi`). Jobs that already
have a `done` line are skipped, so an interrupted run resumes.

Instruments:
  timer  MetaSchedule's runner: `time_evaluator` with --number calls per repeat, --repeat
         repeats, each at least --min-repeat-ms; results in seconds per call. On a CPU the
         cache is flushed before every repeat (--cache-flush 1, the default; MetaSchedule's
         `enable_cpu_cache_flush`). With a reference, the outputs are compared first
         (--rtol/--atol).
  nvtx   --warmup calls, then one call inside an NVTX push/pop range named by the record
         id in domain --domain, so `ncu --nvtx --nvtx-include` profiles exactly that call.
  perf   calibrate N calls to last --min-time-s (at most --max-calls), then run them with
         `perf stat` (--perf, --perf-events) attached to this process and switched on and
         off around them through its control FIFO; getrusage deltas and wall time per call.

--rounds N (timer) times every job once per round, N interleaved rounds each in a new
order (events of round r in `<out stem>.round-<r>.jsonl`), and writes one done line per job
to --out: its best round (lowest mean), with `rounds` and `round_means_s`.

By default the jobs run in a child process (the harness with --in-process) whose output
goes to `<out>.log`: a kernel that crashes the child or runs past --timeout-s becomes a
`done` line with its error and a new child goes on with the rest. --in-process runs them
in this process, as under ncu, which then watches the process itself. A child dies with
the process that started it (Linux PR_SET_PDEATHSIG, else a thread that watches its
parent), so a supervisor killed even with SIGKILL leaves no kernel running behind it.
"""

from pathlib import Path

from .events import EventTail, append_event, done_events, read_events
from .host import (HOST_FIELDS, cpu_model, cpu_signature, device_identity, host_identity, load_average, nvidia_smi_gpus,
                   settle, timed_busy, visible_gpu)
from .instruments import (CUDA_ARCH_ENV, INSTRUMENT_OPTIONS, INSTRUMENTS, Kernel, Nvtx, Perf, PerfCounter, Timer,
                          check_outputs, cuda_device, load_kernel, nvcc_cubin, random_array, run_in_process,
                          seeded_inputs, short_error, use_cuda_compiler)
from .lifetime import (EXIT_CONTEXT_LOST, EXIT_ORPHANED, EXIT_UNUSABLE, PACKAGE, STARTUP_S, ChildExit, child_env,
                       command, describe_exit, die_with_parent, kill_group, log_tail, orphan_safe, run_child)
from .supervisor import (batch_jobs, best_round, failed_job, round_events, supervise, supervise_job,
                         supervise_rounds)

# The package's folder: a bundle ships it whole.
HARNESS = Path(__file__).resolve().parent

__all__ = [
    "HARNESS", "PACKAGE", "EventTail", "append_event", "done_events", "read_events",
    "HOST_FIELDS", "cpu_model", "cpu_signature", "device_identity", "host_identity", "load_average", "nvidia_smi_gpus", "settle", "timed_busy",
    "visible_gpu", "CUDA_ARCH_ENV", "cuda_device", "nvcc_cubin", "use_cuda_compiler", "INSTRUMENT_OPTIONS", "INSTRUMENTS", "Kernel", "Nvtx", "Perf", "PerfCounter", "Timer",
    "check_outputs", "load_kernel", "random_array", "run_in_process", "seeded_inputs", "short_error",
    "EXIT_CONTEXT_LOST", "EXIT_ORPHANED", "EXIT_UNUSABLE", "STARTUP_S", "ChildExit", "child_env", "command",
    "describe_exit", "die_with_parent", "kill_group", "log_tail", "orphan_safe", "run_child",
    "batch_jobs", "best_round", "failed_job", "round_events", "supervise", "supervise_job", "supervise_rounds",
]
