"""The device program: the kernel harness (the package harness/) that loads, checks, times and
profiles kernels in supervised child processes. It imports no project module, so a bundle
ships the package whole to a machine that has only the TVM runtime."""
