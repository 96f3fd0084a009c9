"""The data layer: workspaces and their tables, schemas, the MetaSchedule database,
identities, targets and TVM shims. It imports nothing from features, models or stages."""
