"""Triage's developer tools: what a checkout's make targets and ``triage`` command run.

The local deployment (:mod:`~triage_tools.local`), the embedded PostgreSQL
(:mod:`~triage_tools.embedded`), ``make run`` (:mod:`~triage_tools.run`), the Celery runner
(:mod:`~triage_tools.distributed`), the failure drill (:mod:`~triage_tools.drill`) and the
Airflow settings applier (:mod:`~triage_tools.deploy`). They import the product (``triage``);
nothing in ``plugins/`` or ``dags/`` imports them (``tests/unit/test_layout.py``), and the image
does not contain them. Installed by ``make setup`` with the dev requirements.
"""
