"""Where kernels run to be measured and profiled (the run modes of `measure.mode` and
`collect.mode`): on the executor's devices, or on a device host that receives a bundle
(kernels, references, the standalone kernel harness and a runtime-only TVM) and sends back
its results."""
