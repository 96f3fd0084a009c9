"""Where the pipeline writes when no setting says otherwise: `$PIPELINE_HOME`, else the working
folder. Never the folder the package is installed in (site-packages is shared, often read-only,
and gone with the next upgrade); in a source checkout run from its root (`make run`) that is the
checkout, as before. The config's `paths.*` and Hydra's run folders follow the same rule
(`${oc.env:PIPELINE_HOME,.}` in conf/config.yaml); the MLflow store reads it here."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "PIPELINE_HOME"


def home() -> Path:
    """`$PIPELINE_HOME` (made absolute) when set and not empty, else the working folder."""
    value = os.environ.get(HOME_ENV, "").strip()
    return Path(value).expanduser().resolve() if value else Path.cwd()
