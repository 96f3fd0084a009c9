"""Nsight Compute features: the ncu command line, batch profiling of the kernel harness
(pipeline/device/harness, NVTX instrument) with isolation of kernels that crash or hang,
and a parser of .ncu-rep reports."""
