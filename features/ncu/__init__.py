"""Nsight Compute features: a runtime-only harness that runs many kernels in one process
(each in an NVTX range named by its record), the ncu command line, batch profiling with
isolation of kernels that crash or hang, and a parser of .ncu-rep reports."""
