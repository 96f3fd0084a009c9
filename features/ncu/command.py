"""The ncu command line for one batch (pure: tested without a GPU)."""

from __future__ import annotations

import re

from features.ncu import sections

# NVTX domain of the harness's ranges; ncu profiles only launches inside them.
NVTX_DOMAIN = "tcp_collect"
CLOCK_CONTROL = ("base", "none")
CACHE_CONTROL = ("all", "none")
REPLAY_MODES = ("kernel", "application")


def nvtx_filter(domain: str = NVTX_DOMAIN) -> str:
    """Every push/pop range of `domain` (ranges are named by record id)."""
    return f"regex:{re.escape(domain)}@.+/"


def build_command(target_argv: list[str], report: str, *, ncu: str = "ncu", metrics: list[str] | None = None,
                  section_set: str | None = None, clock_control: str = "base", cache_control: str = "all",
                  replay_mode: str = "kernel", domain: str = NVTX_DOMAIN, extra_args: list[str] = (),
                  section_folder: str | None = None) -> list[str]:
    """`ncu ... <target_argv>` writing `report` (.ncu-rep).

    Either `metrics` or `section_set` (e.g. `full`). The curated list is collected through the
    project's section files (`--section-folder <section_folder> --section tcp_...`, the files
    of ncu_profiles/ when `section_folder` is None), as one collects it by hand; any other list
    (one the device cut short, one of your own) through one `--metrics` option."""
    if clock_control not in CLOCK_CONTROL:
        raise ValueError(f"collect.ncu.clock_control={clock_control!r}; valid: {', '.join(CLOCK_CONTROL)}")
    if cache_control not in CACHE_CONTROL:
        raise ValueError(f"collect.ncu.cache_control={cache_control!r}; valid: {', '.join(CACHE_CONTROL)}")
    if replay_mode not in REPLAY_MODES:
        raise ValueError(f"collect.ncu.replay_mode={replay_mode!r}; valid: {', '.join(REPLAY_MODES)}")
    if bool(metrics) == bool(section_set):
        raise ValueError("give either collect.ncu.metrics or collect.ncu.set (e.g. full), not both or neither")
    if not str(report).endswith(".ncu-rep"):
        raise ValueError(f"the report path must end in .ncu-rep: {report}")
    cmd = [
        ncu,
        "--export", str(report), "--force-overwrite",
        "--nvtx", "--nvtx-include", nvtx_filter(domain),
        "--clock-control", clock_control,
        "--cache-control", cache_control,
        "--replay-mode", replay_mode,
    ]
    if section_set:
        cmd += ["--set", section_set]
    elif sections.covers(metrics):
        cmd += ["--section-folder", str(section_folder or sections.folder())]
        for ident in sections.identifiers():
            cmd += ["--section", ident]
    else:
        cmd += ["--metrics", ",".join(metrics)]
    cmd += [str(a) for a in extra_args]
    return cmd + [str(a) for a in target_argv]
