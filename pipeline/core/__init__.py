"""The data layer: workspaces and their table catalog, schemas, the MetaSchedule database,
identities, locks, sharding, releases, where runs write (home), the errors a user can fix,
optional packages (extras) and the registry helper that chooses a component by kind. It
imports nothing from the floors above (compute, the libraries, tuning, stages); below it
are only the TVM shims (pipeline/shims) and the device program (pipeline/device)."""
