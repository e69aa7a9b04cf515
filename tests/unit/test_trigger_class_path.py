"""A deferred task stores its trigger's class path; the path of before the adapter room resolves."""

from __future__ import annotations

from airflow.sdk.module_loading import import_string

from triage.adapters.triggers import ModelBatchTrigger


def test_the_trigger_class_path_of_before_the_move_still_resolves() -> None:
    assert import_string("triage.operators.model_batches.ModelBatchTrigger") is ModelBatchTrigger
