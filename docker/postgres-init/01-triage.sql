-- The Triage job database, next to Airflow's metadata database on the compose `postgres` service.
--
-- The postgres image runs this file once, when it initialises an empty data volume
-- (/docker-entrypoint-initdb.d), through psql as the superuser POSTGRES_USER (`airflow`) connected
-- to POSTGRES_DB (`airflow`). To run it again: `docker compose down -v`.
--
-- Roles, so that Airflow tasks cannot change the schema or write the transition log, and each
-- login does one job (docs/security.md):
--   triage      owns the database and the `triage` schema; only `triage-migrate` logs in as it
--               (Alembic migrations: tables, enums, triggers, grants).
--   triage_app  the pipeline (connection `triage_db`): reads and writes rows, nothing else.
--   triage_review  reviewers' decisions (connection `triage_db_review`: the web service and
--               review_jobs): the only login that may move jobs out of manual review.
--   triage_maintenance  retention (connection `triage_db_maintenance`: triage_maintenance):
--               the only login that may run the retention functions.
--   triage_ledger_owner  nobody logs in as it: migration 0005 gives it the two SECURITY DEFINER
--               jobs triggers, and it may only read job_transitions and insert into job_events.
--               `triage` is a member so that it can hand the triggers over (it has no CREATEROLE).
-- Development passwords, matching docker-compose.yaml (like upstream's airflow:airflow).

\set ON_ERROR_STOP on

CREATE ROLE triage LOGIN PASSWORD 'triage';
CREATE ROLE triage_app LOGIN PASSWORD 'triage_app';
CREATE ROLE triage_review LOGIN PASSWORD 'triage_review';
CREATE ROLE triage_maintenance LOGIN PASSWORD 'triage_maintenance';
CREATE ROLE triage_ledger_owner NOLOGIN;
GRANT triage_ledger_owner TO triage;

CREATE DATABASE triage OWNER triage;

-- Only the Triage login roles may connect to the job database, and none to Airflow's.
-- No TEMPORARY: Triage never uses temp objects, and a temp table, type or cast is how a session
-- would try to borrow the SECURITY DEFINER triggers (migration 0005).
REVOKE ALL ON DATABASE triage FROM PUBLIC;
GRANT CONNECT ON DATABASE triage TO triage_app, triage_review, triage_maintenance;
REVOKE CONNECT ON DATABASE airflow FROM PUBLIC;

\connect triage

-- The schema exists before the first migration so that default privileges can name it; the
-- migrations' CREATE SCHEMA IF NOT EXISTS leaves it as it is.
CREATE SCHEMA triage AUTHORIZATION triage;
GRANT USAGE ON SCHEMA triage TO triage_app;

-- Whatever the owner creates in the schema from now on is usable by the app role: row access
-- only (no TRUNCATE, REFERENCES or TRIGGER). Migration 0003 narrows this per table
-- (job_events and classifications append-only, jobs never deleted; docs/observability.md).
ALTER DEFAULT PRIVILEGES FOR ROLE triage IN SCHEMA triage
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO triage_app;
ALTER DEFAULT PRIVILEGES FOR ROLE triage IN SCHEMA triage
    GRANT USAGE, SELECT ON SEQUENCES TO triage_app;
