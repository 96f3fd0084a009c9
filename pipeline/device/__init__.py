"""The device program: the kernel harness (harness.py) that loads, checks, times and
profiles kernels in supervised child processes. It imports no project module, so a bundle
ships the file whole to a machine that has only the TVM runtime."""
