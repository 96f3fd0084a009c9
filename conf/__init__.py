"""The Hydra configs (config.yaml and one folder per config group). This folder stays the
repository's top-level conf/ and installs as the package `pipeline.conf` (pyproject.toml), which
Hydra reads as `pkg://pipeline.conf`: a config package needs this file."""
