"""The operators of ``review_jobs`` and ``review_jobs_interactive``: thin adapters over
:mod:`triage.review`.

Who decided is the Airflow user: for ``review_jobs`` the user who triggered the run
(``dag_run.triggering_user_name``, set by the UI, the REST API and the CLI since Airflow 3.1),
for the interactive DAG the user who answered the human-in-the-loop form
(``responded_by_user``). A run without one (a scheduled or older run) records
``airflow:<run_id>``.

Review decisions are not retried blindly: an invalid run (bad params, taxonomy unreadable) and a
refused job fail with ``AirflowFailException`` (no retry) after the valid jobs were applied.
Anything else (the database is down) raises and Airflow retries; a retry is safe because a
decision applied twice changes nothing.

A reviewer's label is sent through the ``triage_label_action`` connection, when it exists,
after its decision committed (:func:`triage.review.decisions.send_reviewed_label`). A label the
provider did not confirm fails the task with ``AirflowException``: Airflow's retry applies the
same decisions again (``already_applied``) and sends the labels again under the same keys.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from triage.operators.base import LABEL_ACTION_CONN_ID, REVIEW_CONN_ID, TriageOperator, build_label_action
from triage.operators.retry import default_args

if TYPE_CHECKING:
    from airflow.sdk import Context

    from triage.ports.label_actions import LabelAction
    from triage.review.config import ReviewRunConfig
    from triage.review.decisions import ReviewReport

log = logging.getLogger(__name__)

REPORT_KEY = "review_report"

REVIEW_DEFAULT_ARGS = default_args(retries=1, max_retry_delay=timedelta(minutes=5))
"""The default_args of both review DAGs: one retry, for a database that was briefly away (safe:
a decision applied twice changes nothing). Refusals fail with AirflowFailException and are never
retried."""


def reviewer(context: Context) -> str:
    """The Airflow user who triggered this run, or ``airflow:<run_id>`` when Airflow names none."""
    dag_run = context["dag_run"]
    name = getattr(dag_run, "triggering_user_name", None)
    return str(name) if name else f"airflow:{dag_run.run_id}"


class _ReviewOperator(TriageOperator):
    """Shared: the taxonomy, the label action, applying a config, and the report (log, XCom,
    refusal). The job database is ``triage_db_review`` by default: the review role's login, the
    only one PostgreSQL lets decide.

    :param action_conn_id: the label action's HTTP connection (as ``persist``'s); no action
        when it does not exist.
    """

    def __init__(
        self,
        *,
        triage_conn_id: str = REVIEW_CONN_ID,
        action_conn_id: str | None = LABEL_ACTION_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(triage_conn_id=triage_conn_id, **kwargs)
        self.action_conn_id = action_conn_id

    def label_action(self) -> LabelAction | None:
        """The seam tests may override: where a reviewer's label is sent."""
        return build_label_action(self.action_conn_id)

    def taxonomy_names(self) -> frozenset[str]:
        """The seam tests override: the labels a reviewer may give."""
        from triage.classifiers.taxonomy import Taxonomy, TaxonomyError

        try:
            return Taxonomy.load().names
        except TaxonomyError as exc:
            raise AirflowFailException(f"cannot check labels: {exc}") from None

    def apply(self, context: Context, config: ReviewRunConfig, who: str) -> dict[str, Any]:
        from triage.review.decisions import apply_review

        names = self.taxonomy_names()
        action = self.label_action() if config.decision == "label" else None
        try:
            report = apply_review(
                self.store,
                config.job_ids,
                config,
                reviewer=who,
                taxonomy_names=names,
                send_label=action.send if action is not None else None,
            )
        finally:
            if action is not None:
                action.close()
            self.dispose()
        return _reported(context, report)


def _reported(context: Context, report: ReviewReport) -> dict[str, Any]:
    """Log the report, keep it in XCom, and fail (without retry) if any job was refused."""
    log.info("%s", report.to_markdown())
    summary = report.to_dict()
    if report.unsent:  # the decisions stand; a retry applies them again and sends the labels again
        context["ti"].xcom_push(key=REPORT_KEY, value=summary)
        reasons = "; ".join(f"{j.job_id}: {j.action}" for j in report.unsent)
        raise AirflowException(
            f"{len(report.unsent)} reviewer labels not confirmed by the label provider (their decisions stand; "
            f"the retry sends them again under the same keys; refused: {len(report.refused)}): {reasons}"
        )
    if report.refused:
        context["ti"].xcom_push(key=REPORT_KEY, value=summary)
        reasons = "; ".join(f"{j.job_id}: {j.detail}" for j in report.refused)
        raise AirflowFailException(
            f"{len(report.refused)} of {len(report.jobs)} jobs refused, nothing changed for them "
            f"(applied {report.count('applied')}, already applied {report.count('already_applied')}): {reasons}"
        )
    return summary


def _config(**data: Any) -> ReviewRunConfig:
    from triage.review.config import InvalidReviewConfig, ReviewRunConfig

    try:
        return ReviewRunConfig.from_params(data)
    except InvalidReviewConfig as exc:
        raise AirflowFailException(str(exc)) from None


class ReviewJobsOperator(_ReviewOperator):
    """Apply the run's review decision (its params: ``job_ids``, ``decision``, ``label``,
    ``note``, ``max_replays``) to each job, each in its own transaction, as the triggering user.

    Returns (and logs) the report: per job ``applied``, ``already_applied`` or ``refused`` with
    the reason. Fails without retry if any job was refused, after applying the others.

    Decision ``replay`` takes the filter params instead of job ids: a dry run (the default)
    logs and returns how many jobs match and the first of them; otherwise the matching jobs
    are requeued as the triggering user, with the note (:func:`triage.review.replay.run_replay`).
    The same replay submitted again reports ``already_applied`` and changes nothing.
    """

    def execute(self, context: Context) -> dict[str, Any]:
        params = context["params"]
        config = _config(**{k: params[k] for k in params})
        if config.decision == "replay":
            return self.replay(config, reviewer(context))
        return self.apply(context, config, reviewer(context))

    def replay(self, config: ReviewRunConfig, who: str) -> dict[str, Any]:
        from triage.contracts.replay import InvalidReplayFilter
        from triage.review.replay import run_replay

        try:
            selection = config.replay_filter()
        except InvalidReplayFilter as exc:  # the config checked it already; for a subclass that did not
            raise AirflowFailException(str(exc)) from None
        try:
            report = run_replay(self.store, selection, actor=who, max_replays=config.max_replays)
        finally:
            self.dispose()
        log.info("%s", report.to_markdown())
        return report.to_dict()


class PickReviewCaseOperator(TriageOperator):
    """Choose the job to put in front of a reviewer: the run's ``job_id`` param, or the oldest
    open review. Returns what the reviewer sees (:func:`triage.review.cases.describe`).

    Skips (and so skips the question) when no job waits for review; fails when the given job
    is not waiting for review. Reads through ``triage_db_review``, as the answer is applied.
    """

    def __init__(self, *, triage_conn_id: str = REVIEW_CONN_ID, **kwargs: Any) -> None:
        super().__init__(triage_conn_id=triage_conn_id, **kwargs)

    def execute(self, context: Context) -> dict[str, str]:
        import uuid

        from triage.review.cases import describe

        raw = context["params"].get("job_id")
        try:
            wanted = [uuid.UUID(str(raw))] if raw else None
        except ValueError:
            raise AirflowFailException(f"job_id {raw!r} is not a UUID") from None
        try:
            cases = self.store.review.open_reviews(wanted, limit=1)
            if not cases and wanted:
                status = self.store.get_status(wanted[0]).value
                raise AirflowFailException(f"job {raw} is {status}, not waiting for review")
        except LookupError:
            raise AirflowFailException(f"job {raw} does not exist") from None
        finally:
            self.dispose()
        if not cases:
            raise AirflowSkipException("no job is waiting for review")
        case = describe(cases[0])
        log.info("asking for a decision on job %s (%s)", case["job_id"], cases[0].reason)
        return case


class ApplyReviewAnswerOperator(_ReviewOperator):
    """Apply the answer of the human-in-the-loop task to the picked job, as the user who answered.

    :param case_task_id: the task that picked the job (:class:`PickReviewCaseOperator`).
    :param answer_task_id: the ``HITLOperator`` whose options come from
        :func:`triage.review.cases.options`.
    """

    def __init__(self, *, case_task_id: str, answer_task_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case_task_id, self.answer_task_id = case_task_id, answer_task_id

    def execute(self, context: Context) -> dict[str, Any]:
        from triage.review.cases import decision_of

        ti = context["ti"]
        case = ti.xcom_pull(task_ids=self.case_task_id)
        answer = ti.xcom_pull(task_ids=self.answer_task_id)
        if not case or not answer or not answer.get("chosen_options"):
            raise AirflowFailException("no answer to apply: the reviewer's task left no response")
        try:
            decision, label = decision_of(answer["chosen_options"][0])
        except ValueError as exc:
            raise AirflowFailException(str(exc)) from None
        user = answer.get("responded_by_user") or {}
        who = str(user.get("name") or user.get("id") or f"airflow:{context['dag_run'].run_id}")
        note = (answer.get("params_input") or {}).get("note") or None
        config = _config(
            job_ids=[case["job_id"]],
            decision=decision,
            label=label,
            note=note,
            max_replays=context["params"].get("max_replays", 3),
        )
        return self.apply(context, config, who)
