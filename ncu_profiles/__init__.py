"""Nsight Compute section files of the curated metric list (features/ncu/sections.py writes
them). This folder stays the repository's top-level ncu_profiles/, the folder to give
`ncu --section-folder`, and installs as the package `features.ncu.profiles` (pyproject.toml).
By default stage=collect also keeps its raw reports here, in `<workspace>/device=<device>/`
subfolders, which ncu does not read as sections."""
