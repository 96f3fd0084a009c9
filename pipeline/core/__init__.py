"""The data layer: workspaces and their table catalog, schemas, the MetaSchedule database,
identities, targets, TVM shims, sharding, the kernel harness and the builder, and the
registry helper that chooses a component by kind. It imports nothing from features,
models or stages."""
