"""The one room where Triage meets Airflow below its operators: connections become hooks and
clients here, once, and the operators (``operators/``) and the pages (``web/``) take them from
here.

- :mod:`.ledger_db`: the job database behind ``triage_db`` (and the review and maintenance
  logins) through the postgres provider's ``PostgresHook``, with the job database's engine options;
- :mod:`.model_api`: the model connection ``triage_llm`` read as the classifier's settings, the
  content cache switch and the shared budget;
- :mod:`.http_actions`: the HTTP actions a connection configures: the label provider, the event
  sink, the alerts' webhook (why not the HTTP provider's ``HttpHook``: its docstring);
- :mod:`.connections`: what those share (a connection's URL, Variables, the API server's URL);
- :mod:`.task_context`: what a task's context names (its batch, its lease owner);
- :mod:`.callbacks`: the failure callback; :mod:`.triggers`: batch mode's trigger;
- :mod:`.airflow_api`: the client of Airflow's public REST API (reconciliation's cross-check).

The services below (``pipeline/``, ``review/``, ``reconciliation/``) never import this room:
they name the small Protocols of :mod:`triage.ports`, which these implement. Importing a module
here is cheap (a DAG parse imports the callbacks): Airflow's providers are imported where they
are used; ``httpx``, which ``http_actions`` and ``airflow_api`` import at the top, the task SDK
has loaded already.
"""

from __future__ import annotations
