"""MLflow models-from-code entry point of the logged cost models (see models/pyfunc.py).

MLflow stores this file with each logged model and runs it at load time; the trained model
itself is the `model` artifact (a folder written by CostModel.save)."""

from mlflow.models import set_model

from models.pyfunc import CostModelPyfunc

set_model(CostModelPyfunc())
