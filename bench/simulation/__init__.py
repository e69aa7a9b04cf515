"""The benchmarks' simulation of a ledger's past: bulk loads and decisions written as the
database's owner, triggers aside (``session_replication_role = replica``), which no deployment
does. The only writes to the ledger's tables outside ``plugins/triage/jobs/`` but the migrations
(``WRITES_EXEMPT`` of triage_tools/layout.py, which tests/unit/test_layout.py runs, exempts this
folder, and only it)."""
