"""A trained cost model as one MLflow model that loads anywhere: native flavor + pyfunc.

`log_model` writes, in the active run, one MLflow model (`model`) with two flavors:
  <library>        the model's own library object, as its MLflow flavor saves it:
                   `mlflow.lightgbm.load_model(uri)` / `mlflow.xgboost...` give the Booster,
                   `mlflow.pytorch.load_model(uri)` the MLP's network (a torch.export program
                   that takes scaled inputs; input.json holds the scaling)
  python_function  `mlflow.pyfunc.load_model(uri).predict(features)` on the workspace's
                   feature tables as stored (models/pyfunc_model.py, shipped in the model's
                   `code/` with MLflow's code_paths; it imports nothing from this project)
An ensemble (models/ensemble.py) has no native flavor: its pyfunc reads the members'
boosters from the data folder. Trees on per-store rows (pack-sum, ms_xgb) are scored per
store, with the record's context columns beside it, and summed per record.
Requirements (`requirements.txt`): mlflow, numpy, pandas and the model's library, pinned to
the versions installed here without local build labels (`torch==2.13.0`, not `+cpu`), so
that a package registry has every one of them. The signature names every input column
(optional, so that a missing one is reported by the model itself, by name, not in a dump
of the whole schema; typed `any` because stored integer columns read as float once they
hold nulls) and carries an input example of real rows.

The project's own saved model (CostModel.save) rides along in the pyfunc's data folder
(`data/cost_model/`): `load_cost_model(uri)` restores it for tuning and refits.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pandas as pd
from mlflow.models import Model, ModelSignature
from mlflow.types.schema import AnyType, ColSpec, Schema, TensorSpec
from packaging.version import Version

from features import roofline
from models import ensemble, pyfunc_model, registry
from models.base import CostModel

LOADER = Path(pyfunc_model.__file__)
ROOFLINE = Path(roofline.__file__)  # the loader computes a store's roofline bound with it (numpy only)
DATA = "cost_model"  # the pyfunc's data folder: data/cost_model/ in the model
MODEL_NAME = "model"  # the logged model's name in its run
#: how the shipped loader scores each library's model (models/pyfunc_model.py)
PREDICTORS = {"lightgbm": "trees", "xgboost": "trees", "mlp": "mlp", "ms_xgb": "pack_sum"}
ENSEMBLE = "ensemble"  # models.ensemble.EnsembleModel's library: members scored by the loader
COUNTERS = "counters"  # models.counters.CounterModel's library: counter boosters, then the latency booster
#: the package each native flavor needs
PACKAGES = {"lightgbm": "lightgbm", "xgboost": "xgboost", "pytorch": "torch"}
#: files every flavor's save_model writes for the model as a whole, kept from the pyfunc's
ENVIRONMENT = {"MLmodel", "conda.yaml", "python_env.yaml", "requirements.txt", "constraints.txt"}


class PortableModelError(ValueError):
    """A trained model that cannot be logged as a portable MLflow model."""


def pins(*packages: str) -> list[str]:
    """`package==version` for each installed package, public versions only (no `+cpu`)."""
    out = []
    for p in packages:
        try:
            out.append(f"{p}=={Version(metadata.version(p)).public}")
        except metadata.PackageNotFoundError:
            pass
    return out


def requirements(model: CostModel) -> list[str]:
    members = getattr(model, "members", {}).values()  # an ensemble: its members' libraries
    libraries = [PACKAGES[m.flavor] for m in (*members, model) if m.flavor in PACKAGES]
    return pins("mlflow", "numpy", "pandas", *dict.fromkeys([*libraries, *getattr(model, "packages", ())]))


def stored_names(table) -> dict[str, str]:
    """Training column -> the column of the stored feature table it was read from
    (models.tables.build_table prefixes each with its group: `static.`, `profiler.`)."""
    return {c: c[len(g) + 1:] for g, cols in table.groups.items() for c in cols if c.startswith(f"{g}.")}


def input_tables(model: CostModel, table, device: str) -> list[str]:
    """The workspace tables (paths under the workspace) that hold the model's input columns."""
    profiler = f"features/{'ncu' if model.spec.target_kind == 'cuda' else 'cpu'}/device={device}"
    groups = {g for g, cols in table.groups.items() if set(cols) & set(model.spec.columns)}
    out = ["features/static_stores"] if model.spec.store_columns else []
    out += ["features/static"] if "static" in groups else []
    return out + ([profiler] if "profiler" in groups else [])


def contract(model: CostModel, table, device: str) -> dict:
    """What the shipped loader needs (input.json): how to read the input, how to score it."""
    if model.library == ENSEMBLE:
        return ensemble_contract(model, table, device)
    if model.library == COUNTERS:
        return counters_contract(model, table, device)
    if model.library not in PREDICTORS or model.flavor not in PACKAGES:
        raise PortableModelError(f"model {model.name!r} (library {model.library!r}, flavor {model.flavor!r}) has no "
                                 f"portable predictor in models/pyfunc_model.py; known: {', '.join(PREDICTORS)}")
    names = stored_names(table)
    columns = [names.get(c, c) for c in model.spec.columns]
    if len(set(columns)) < len(columns):
        raise PortableModelError(f"model {model.name!r}: two of its columns have one name in the stored tables "
                                 f"({input_tables(model, table, device)}); they cannot be told apart")
    out = {"format": 1, "model": model.name, "library": model.library, "flavor": model.flavor,
           "predictor": predictor(model), "feature_set": model.spec.feature_set, "input": model.spec.input,
           "tables": input_tables(model, table, device), "columns": columns,
           "store_columns": list(model.spec.store_columns), "target_kind": model.spec.target_kind,
           "calibrated": bool(model.calibrated), "roofline": getattr(model, "hyperparams", {}).get("roofline"),
           "roofline_base": getattr(model, "hyperparams", {}).get("roofline_base", 0.0)}
    if out["predictor"] == "mlp":
        out["scalers"] = {k: {"mean": np.asarray(s.mean).tolist(), "std": np.asarray(s.std).tolist()}
                          for k, s in (("records", model.record_scaler), ("stores", model.store_scaler))
                          if s.mean is not None}
    return out


def predictor(model: CostModel) -> str:
    """How the shipped loader scores the model: trees on per-store rows sum over the stores."""
    kind = PREDICTORS[model.library]
    return "pack_sum" if kind == "trees" and model.spec.input == "stores" else kind


def ensemble_contract(model: CostModel, table, device: str) -> dict:
    """An ensemble's input.json: its own input, and per member its contract, the booster file
    under the data folder (the project's own save), its weight and its standardization."""
    names = stored_names(table)
    members = {}
    for k, m in model.members.items():
        c = contract(m, table, device)
        if c["predictor"] not in ("trees", "pack_sum"):
            raise PortableModelError(f"ensemble {model.name!r}: member {k!r} ({m.name}) is no tree model; the "
                                     f"portable loader reads only boosters of {', '.join(pyfunc_model.BOOSTER_FILES)}")
        members[k] = {**c, "file": f"members/{k}/{pyfunc_model.BOOSTER_FILES[m.flavor]}",  # ms_xgb: xgboost's
                      "weight": float(model.weights[k]), "scale": [float(v) for v in model.scale[k]]}
        if model.convolution_weights is not None:
            members[k]["convolution_weight"] = float(model.convolution_weights[k])
    conv = ({"convolution_columns": [names.get(c, c) for c in ensemble.CONVOLUTION_COLUMNS]}
            if model.convolution_weights is not None else {})
    return {"format": 1, "model": model.name, "library": model.library, "flavor": model.flavor,
            "predictor": ENSEMBLE, "feature_set": model.spec.feature_set, "input": model.spec.input,
            "tables": sorted({t for c in members.values() for t in c["tables"]}),
            "columns": [names.get(c, c) for c in model.spec.columns], "store_columns": list(model.spec.store_columns),
            "target_kind": model.spec.target_kind, "calibrated": bool(model.calibrated), "members": members, **conv}


def counters_contract(model: CostModel, table, device: str) -> dict:
    """A counter model's input.json: its static input, the counter boosters (one per counter,
    in order; null for a counter it could not fit) and the latency model's booster, which
    reads the static columns then the predicted counters."""
    names = stored_names(table)
    latency = model.latency
    return {"format": 1, "model": model.name, "library": model.library, "flavor": model.flavor,
            "predictor": COUNTERS, "feature_set": model.spec.feature_set, "input": model.spec.input,
            "tables": input_tables(model, table, device), "columns": [names.get(c, c) for c in model.spec.columns],
            "store_columns": [], "target_kind": model.spec.target_kind, "calibrated": bool(model.calibrated),
            "counters": [names.get(c, c) for c in model.counters],
            "counter_files": [model_file if b is not None else None
                              for model_file, b in zip(model.counter_files, model.boosters)],
            "latency": {"model": latency.name, "library": latency.library, "predictor": "trees",
                        "columns": list(latency.spec.columns), "store_columns": [],
                        "file": f"latency/{pyfunc_model.BOOSTER_FILES[latency.library]}"}}


def input_example(model: CostModel, table, spec: dict, rows: int = 4) -> pd.DataFrame:
    """The first records of the training table, as the stored tables have them."""
    part = table.take(np.arange(min(len(table), rows)))
    frame = part.store_frame(list(model.spec.columns)) if spec["store_columns"] else part.frame
    frame = frame.rename(columns=stored_names(table))
    return frame[[pyfunc_model.KEY, *spec["columns"], *spec["store_columns"]]].reset_index(drop=True)


def signature(spec: dict) -> ModelSignature:
    """Every input column by its stored name (see the module docstring); record_id and score out."""
    inputs = [ColSpec("string", pyfunc_model.KEY), ColSpec("string", "task_id", required=False),
              ColSpec(AnyType(), "store_index" if spec["store_columns"] else "error", required=False)]
    inputs += [ColSpec(AnyType(), c, required=False) for c in [*spec["columns"], *spec["store_columns"]]]
    return ModelSignature(inputs=Schema(inputs),
                          outputs=Schema([ColSpec("string", pyfunc_model.KEY), ColSpec("double", "score")]))


def log_model(model: CostModel, table, *, device: str):
    """Log `model` (trained on `table`) in the active run; returns MLflow's ModelInfo."""
    spec = contract(model, table, device)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / DATA
        model.save(data)
        (data / pyfunc_model.CONTRACT).write_text(json.dumps(spec, indent=2))
        return Model.log(None, name=MODEL_NAME, flavor=SimpleNamespace(save_model=save_model), flavor_name=model.flavor,
                         model=model, data=data, signature=signature(spec),
                         input_example=input_example(model, table, spec), pip_requirements=requirements(model),
                         metadata={k: v for k, v in spec.items()
                                   if k not in ("scalers", "members", "latency", "counter_files")})


def save_model(path, mlflow_model: Model, *, model: CostModel, data: Path, signature, input_example,
               pip_requirements) -> None:
    """Model.log's flavor hook: the pyfunc (with the shipped loader and `data`), then the native
    flavor saved by its own MLflow module beside it in the same folder."""
    mlflow.pyfunc.save_model(path, loader_module=LOADER.stem, data_path=str(data), code_paths=[str(LOADER), str(ROOFLINE)],
                             mlflow_model=mlflow_model, signature=signature, input_example=input_example,
                             pip_requirements=pip_requirements)
    if model.flavor in PACKAGES:  # an ensemble has no single library object: the pyfunc only
        with tempfile.TemporaryDirectory() as tmp:
            native = Model()
            save_native(model, Path(tmp) / "native", native, pip_requirements)
            merge(Path(tmp) / "native", Path(path))
        mlflow_model.add_flavor(model.flavor, **native.flavors[model.flavor])
    mlflow_model.model_size_bytes = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    mlflow_model.save(str(Path(path) / "MLmodel"))


def save_native(model: CostModel, path: Path, mlflow_model: Model, pip_requirements: list[str]) -> None:
    """The model's library object through its MLflow flavor (into `mlflow_model`'s flavors)."""
    native = model.native()
    common = dict(mlflow_model=mlflow_model, pip_requirements=pip_requirements)
    if model.flavor == "lightgbm":
        mlflow.lightgbm.save_model(native, str(path), **common)
    elif model.flavor == "xgboost":
        mlflow.xgboost.save_model(native, str(path), model_format="json", **common)
    elif model.flavor == "pytorch":
        example, spec = network_example(len(model.spec.columns), len(model.spec.store_columns))
        # pt2 (torch.export): loads with torch alone, no class of this project, and no pickle
        mlflow.pytorch.save_model(native.eval(), str(path), serialization_format="pt2", input_example=example,
                                  signature=ModelSignature(inputs=Schema(spec)), **common)
    else:
        raise PortableModelError(f"model {model.name!r}: no MLflow flavor {model.flavor!r}")


def network_example(record_dim: int, store_dim: int):
    """Example tensors that torch.export traces the MLP with: (records[, stores, segments]).

    Sizes 0 and 1, and sizes equal to another dimension, would be fixed into the exported
    program; these are neither, so record and store counts stay free."""
    # torch only for an MLP: importing it costs seconds that other models need not pay
    import torch

    taken = {0, 1, record_dim, store_dim}
    n = next(k for k in range(5, 100) if k not in taken)
    m = next(k for k in range(n + 2, 200) if k not in taken)
    example = [torch.zeros(n, record_dim)]
    spec = [TensorSpec(np.dtype(np.float32), (-1, record_dim), "records")]
    if store_dim:
        example += [torch.zeros(m, store_dim), torch.arange(m) % n]
        spec += [TensorSpec(np.dtype(np.float32), (-1, store_dim), "stores"),
                 TensorSpec(np.dtype(np.int64), (-1,), "segments")]
    return tuple(example), spec


def merge(native: Path, path: Path) -> None:
    """The native flavor's files into the model folder (flavor paths are relative to it)."""
    for item in native.iterdir():
        if item.name in ENVIRONMENT:
            continue
        dest = path / item.name
        if item.is_dir():
            clash = [p for p in item.rglob("*") if p.is_file() and (dest / p.relative_to(item)).exists()]
            if clash:
                raise PortableModelError(f"native flavor file {clash[0]} clashes with the pyfunc's files")
            shutil.copytree(item, dest, dirs_exist_ok=True)
        elif dest.exists():
            raise PortableModelError(f"native flavor file {item.name} clashes with the pyfunc's files")
        else:
            shutil.copy2(item, dest)


def saved_folder(root: Path) -> Path:
    """The project's saved model inside a downloaded MLflow model folder."""
    for folder in (root / "data" / DATA, *sorted(root.glob("artifacts/*"))):  # artifacts/: older logged models
        if (folder / "model.json").exists():
            return folder
    raise FileNotFoundError(f"{root} holds no saved cost model (data/{DATA}/model.json): not a model logged by "
                            f"stage=train")


def load_cost_model(uri: str) -> CostModel:
    """The project's own model (fit, continue_fit, predict_arrays) behind an MLflow model URI."""
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri))
    return registry.load(saved_folder(local))
