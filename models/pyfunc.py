"""The MLflow pyfunc wrapper: any trained cost model as `predict(features DataFrame) -> scores`.

Input: one row per record (record-level models) or one row per buffer store with a
`record_id` column (store models), holding the columns named in the model's features.json
(`mlflow.pyfunc.load_model(uri).metadata.metadata` carries the same lists). Output: a
DataFrame with record_id and score (higher = predicted faster), one row per record.
"""

from __future__ import annotations

import mlflow.pyfunc
import pandas as pd

from models import registry


class CostModelPyfunc(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        self.model = registry.load(context.artifacts["model"])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        return self.model.predict_frame(pd.DataFrame(model_input))
