"""Tuning with a learned cost model, and the comparison that shows what it is worth.

  cost_model   PipelineCostModel: a model trained by this pipeline as a MetaSchedule cost
               model (the three lines that put it into ms.tune_tir)
  kinds        the cost models a comparison tunes with, made by kind (`create(kind)`)
  tasks        what is tuned (`tune.tasks`): the workspace's tasks, the operator suite, a network
  runs         one MetaSchedule tuning run and its trials
  comparison   every item tuned with every kind and seed, finished runs kept and reused
  remote       the comparison's runs as jobs on a cluster (executor=ray)
  report       the tables, curves and markdown report of a comparison

stage=tune (pipeline/stages/tune.py) turns the config into these calls.
"""

from pipeline.core.errors import PipelineError


class TuneError(PipelineError):
    """A tuning comparison that cannot run as configured; the message names the setting."""
