"""TenSet on today's TVM: its task pickles, Ansor records and schedules.

- `unpickle`: a restricted Unpickler for TenSet's pickles (allowlisted TVM names only, size
  and depth bounded before anything is built).
- `graph`: TVM 0.8 JSON graph of a ComputeDAG -> TE -> PrimFunc.
- `dataset`: locating, verifying and unpacking a TenSet copy.
- `tasks`: task pickles -> tasks with weights per network.
- `records`: Ansor measure records (v0.2-v0.6 lines) -> rows with TenSet's labels.
- `replay`: Ansor transform steps replayed on `tvm.s_tir.Schedule`.
- `registered`, `join`: computes behind workload keys.
"""
