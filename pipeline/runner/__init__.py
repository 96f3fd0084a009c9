"""Runners: execute exported kernels on a device. `kernel_runner.py` is a standalone
script (TVM runtime + NumPy only) so that it can run on a GPU host that only receives
the artifacts."""
