"""Where the per-item work runs: the executors (local process pools, a Ray cluster), the
persistent builder of stage=replay and tuning, and the progress bars of long loops. On the
data layer (pipeline/core), the TVM shims and the device program; below the libraries."""
