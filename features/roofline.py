"""A roofline bound per buffer store, from PerStoreFeature's counts and the machine's peaks.

Pruner's static analyzer in CPU form: a store's floating-point work runs no faster than the
machine's peak shared by the cores its parallel loops can occupy and the SIMD lanes its
vectorized loops fill, and its cache lines move no faster than the memory bandwidth of those
cores. Every line a store touches counts as moved from memory, unless `cache_bytes` is given:
then a buffer whose reuse distance (PerStoreFeature's reuse_dis_bytes: the bytes touched
between two uses of the same data) fits in that much cache moves each of its lines once
(unique_lines), and only a buffer whose reuse spills it pays for every touch. The larger of
the two times bounds the store; a record's bound is the sum over its stores. Alone it ranks
a network's convolutions about as well as a model trained on other networks; as columns
beside the 164 values it gives trees a hardware-grounded scale they would otherwise have to
learn from data of one machine.

PerStoreFeature stores counts as slog(x) = log2(1 + x) (verified: the float counts of a
record's stores add up to the task's FLOPs); the values here undo that, and the columns
are given back in the same log form (of nanoseconds). This file imports numpy only: logged
models ship it beside their loader (models/pyfunc.py) so that the pyfunc computes the same.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

COLUMNS = ("roof.log_compute_ns", "roof.log_memory_ns", "roof.log_bound_ns")
FLOAT_OPS = ("float_mad", "float_addsub", "float_mul", "float_divmod", "float_mathfunc", "float_otherfunc")
LINE_BYTES = 64


@dataclass(frozen=True)
class Peaks:
    """What the machine can do at best: fp32 FLOP/s and memory bandwidth of all its cores."""

    gflops: float
    gbs: float
    cores: int
    lanes: int = 8  # fp32 lanes of a SIMD register (AVX2)
    cache_bytes: float = 0.0  # cache a core's reuse may stay in (0: every touched line from memory)

    def as_dict(self) -> dict:
        return asdict(self)


def measure_peaks(*, cores: int, lanes: int = 8, size: int = 2048, repeats: int = 5) -> Peaks:
    """This machine's peaks, measured: a float32 matrix product (BLAS uses every core and
    lane) and a 256 MiB copy (bytes read + written per second); the best of `repeats`."""
    a = np.random.default_rng(0).random((size, size), dtype=np.float32)
    a @ a
    best = min(_timed(lambda: a @ a) for _ in range(repeats))
    x = np.ones(64 * 1024 * 1024, np.float32)
    y = np.empty_like(x)
    copy = min(_timed(lambda: np.copyto(y, x)) for _ in range(repeats))
    return Peaks(gflops=2.0 * size**3 / best / 1e9, gbs=2.0 * x.nbytes / copy / 1e9, cores=int(cores), lanes=int(lanes))


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _count(stores: np.ndarray, names: dict[str, int], feature: str) -> np.ndarray:
    v = stores[:, names[feature]].astype(np.float64)
    return np.sign(v) * (np.exp2(np.abs(v)) - 1.0)


def store_bounds(stores: np.ndarray, peaks: Peaks, columns: tuple[str, ...] | list[str]) -> np.ndarray:
    """[n, 3] float32 (COLUMNS): log2(1 + ns) of the compute time, the memory time and their
    maximum for each store row; `columns` names the rows' values (PerStoreFeature names)."""
    names = {n: i for i, n in enumerate(columns)}
    needed = [*FLOAT_OPS, "parallel_prod", "vec_prod", "b0_lines"]
    needed += ["b0_unique_lines", "b0_reuse_dis_bytes"] if peaks.cache_bytes > 0 else []
    missing = [f for f in needed if f not in names]
    if missing:
        raise ValueError(f"roofline needs the PerStoreFeature values {missing}: keep them in the model's store columns")
    flops = sum(_count(stores, names, f) for f in FLOAT_OPS)
    lines = sum(_moved_lines(stores, names, i, peaks.cache_bytes) for i in range(5) if f"b{i}_lines" in names)
    cores = np.clip(_count(stores, names, "parallel_prod"), 1.0, peaks.cores)
    lanes = np.clip(_count(stores, names, "vec_prod"), 1.0, peaks.lanes)
    per_lane = peaks.gflops / (peaks.cores * peaks.lanes)  # GFLOP/s = FLOP/ns
    compute_ns = np.maximum(flops, 0.0) / (per_lane * cores * lanes)
    memory_ns = np.maximum(lines, 0.0) * LINE_BYTES / (peaks.gbs / peaks.cores * cores)  # GB/s = B/ns
    out = np.stack([compute_ns, memory_ns, np.maximum(compute_ns, memory_ns)], axis=1)
    return np.log2(1.0 + out).astype(np.float32)


def _moved_lines(stores: np.ndarray, names: dict[str, int], i: int, cache_bytes: float) -> np.ndarray:
    """The cache lines buffer `i` moves from memory: every touched one, or with a cache, each
    once where its data is reused within `cache_bytes`."""
    touched = _count(stores, names, f"b{i}_lines")
    if cache_bytes <= 0:
        return touched
    reuse = _count(stores, names, f"b{i}_reuse_dis_bytes")
    return np.where((reuse > 0) & (reuse <= cache_bytes), _count(stores, names, f"b{i}_unique_lines"), touched)


def record_bound_ns(stores: np.ndarray, offsets: np.ndarray, peaks: Peaks, columns) -> np.ndarray:
    """[n_records] float64: the sum over each record's stores of their bound, in ns."""
    bound = np.exp2(store_bounds(stores, peaks, columns)[:, 2].astype(np.float64)) - 1.0
    seg = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    return np.bincount(seg, weights=bound, minlength=len(offsets) - 1)
