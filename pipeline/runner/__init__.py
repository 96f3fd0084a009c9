"""Where kernels are measured (`measure.mode`): on this machine, or on a device host that
receives a bundle (kernels, references, the standalone kernel harness and a runtime-only
TVM) and sends back its results."""
