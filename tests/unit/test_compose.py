"""docker-compose.yaml, Dockerfile and the postgres init script, checked without a Docker engine.

The compose file is read with PyYAML (which resolves its anchors and ``<<`` merge keys the way
Compose does); ``docker compose config`` runs too when the Compose plugin is installed.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
INIT_SQL = ROOT / "docker" / "postgres-init" / "01-triage.sql"

AIRFLOW_SERVICES = (
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
    "airflow-init",
    "airflow-cli",
    "flower",
)
# The long-running Airflow services: they need the job tables, so they wait for the migration.
NEEDS_MIGRATED_DB = (
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
)
# Services built on x-airflow-common: the Airflow ones and the one-shot migration.
COMMON_SERVICES = (*AIRFLOW_SERVICES, "triage-migrate")
# Where a service may differ from the common environment, and why.
ENV_OVERRIDES = {"triage-migrate": {"TRIAGE_DATABASE_URL"}}  # the owner role, for migrations
# Where a service mounts more than the common volumes: airflow-init applies airflow_settings.yaml
# with the developer tools' applier, which the image does not contain.
TOOLS_MOUNT = "${AIRFLOW_PROJ_DIR:-.}/triage_tools:/opt/triage/triage_tools:ro"
VOLUME_EXTRAS = {"airflow-init": [TOOLS_MOUNT]}

_DEFAULTED = re.compile(r"\$\{(\w+):-([^}]*)\}")


def with_defaults(value: str) -> str:
    """What Compose makes of ``value`` with an empty environment (``${VAR:-default}``)."""
    return _DEFAULTED.sub(lambda m: m[2], value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


@pytest.fixture(scope="module")
def common(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["x-airflow-common"]


@pytest.fixture(scope="module")
def common_env(common: dict[str, Any]) -> dict[str, str]:
    return common["environment"]


def airflow_version_pinned() -> str:
    match = re.search(r"^apache-airflow==([\w.]+)\s*$", (ROOT / "requirements.txt").read_text(), re.M)
    assert match, "requirements.txt pins no apache-airflow==X"
    return match[1]


def dockerfile_from() -> str:
    lines = [line.split() for line in DOCKERFILE.read_text().splitlines() if line.upper().startswith("FROM ")]
    assert len(lines) == 1, "expected a single-stage Dockerfile"
    return lines[0][1]


def init_sql_roles() -> dict[str, str]:
    """Role name -> password, from the init script."""
    found = re.findall(r"CREATE ROLE (\w+) LOGIN PASSWORD '([^']*)'", INIT_SQL.read_text())
    return dict(found)


def test_services_exist(services: dict[str, Any]) -> None:
    assert set(services) >= {"postgres", "redis", "triage-migrate", *AIRFLOW_SERVICES}


def test_optional_services_are_behind_profiles(services: dict[str, Any]) -> None:
    assert services["airflow-cli"]["profiles"] == ["debug"]
    assert services["flower"]["profiles"] == ["flower"]


@pytest.mark.parametrize("name", COMMON_SERVICES)
def test_service_is_built_on_the_common_anchor(
    name: str, services: dict[str, Any], common: dict[str, Any], common_env: dict[str, str]
) -> None:
    service = services[name]
    assert service["image"] == common["image"]
    assert service["build"] == common["build"]
    extra = VOLUME_EXTRAS.get(name, [])
    assert service["volumes"] == [*common["volumes"], *extra]
    env = service["environment"]
    allowed = ENV_OVERRIDES.get(name, set())
    assert {key: env.get(key) for key in common_env if key not in allowed} == {
        key: value for key, value in common_env.items() if key not in allowed
    }


def test_image_is_built_from_the_dockerfile_at_the_pinned_airflow_version(common: dict[str, Any]) -> None:
    version = airflow_version_pinned()
    assert common["build"] == "."
    tag = with_defaults(common["image"])
    assert tag.rsplit(":", 1)[1] == version, f"image {tag} is not tagged with Airflow {version}"
    base = dockerfile_from()
    assert re.fullmatch(rf"apache/airflow:{re.escape(version)}-python3\.\d+", base), base


def test_dockerfile_python_is_a_supported_one(common: dict[str, Any]) -> None:
    """The base image's Python is one the project supports (pyproject's classifiers)."""
    python = dockerfile_from().rsplit("-python", 1)[1]
    assert f'"Programming Language :: Python :: {python}"' in (ROOT / "pyproject.toml").read_text()


def test_no_runtime_pip_installs(common_env: dict[str, str], services: dict[str, Any]) -> None:
    for name in COMMON_SERVICES:
        assert not services[name]["environment"].get("_PIP_ADDITIONAL_REQUIREMENTS"), name


def dockerfile_instructions() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    instructions = [line.strip() for line in re.sub(r"\\\n", " ", DOCKERFILE.read_text()).splitlines()]
    return [line for line in instructions if line and not line.startswith("#")]


def test_dockerfile_installs_pinned_requirements_as_airflow_user() -> None:
    text = DOCKERFILE.read_text()
    instructions = dockerfile_instructions()
    user_index = instructions.index("USER airflow")
    (pip_index,) = [i for i, line in enumerate(instructions) if "pip install" in line]
    assert user_index < pip_index
    install = instructions[pip_index].removeprefix("RUN ").split("&&")[0]
    pip = shlex.split(install)
    assert "--no-cache-dir" in pip
    assert pip[pip.index("-r") + 1] == "/requirements.txt"
    assert '"apache-airflow[fab]==${AIRFLOW_VERSION}"' in install, "pins Airflow; FAB for compose"
    assert not any("requirements-dev" in line for line in instructions), "no test tools nor embedded database"
    for folder in ("plugins", "dags", "include"):
        assert re.search(rf"^COPY .*\b{folder}/ /opt/airflow/{folder}/$", text, re.M), folder
    # airflow-init applies the settings file from the image.
    assert re.search(r"^COPY .*airflow_settings\.yaml /opt/airflow/airflow_settings\.yaml$", text, re.M)


def test_dockerfile_installs_under_the_base_images_constraints_then_checks() -> None:
    """Airflow's own constraints, the ones the official image carries and was built with, plus
    Triage's small file; the stand-in copy of Airflow's file is gone; `pip check` runs last."""
    instructions = dockerfile_instructions()
    (run,) = [line for line in instructions if "pip install" in line]
    install, check = run.removeprefix("RUN ").split("&&")
    assert '-c "${HOME}/constraints.txt"' in install, "the base image's constraints, quoted for the shell"
    pip = shlex.split(install)
    constraints = [pip[i + 1] for i, arg in enumerate(pip) if arg == "-c"]
    assert constraints == ["${HOME}/constraints.txt", "/triage-constraints.txt"]
    assert check.split() == ["pip", "check"]
    assert "COPY requirements.txt docker/triage-constraints.txt /" in instructions
    assert not (ROOT / "docker" / "airflow-constraints.txt").exists()
    assert not any("airflow-constraints" in line for line in instructions)


def test_triage_constraints_pin_only_what_the_local_lock_pins_alike() -> None:
    """docker/triage-constraints.txt holds pins (and comments) only, each the local lock's version:
    the image and the virtualenv run the same version of what Airflow leaves unpinned."""
    lines = [line for line in (ROOT / "docker" / "triage-constraints.txt").read_text().splitlines() if line]
    pins = [line for line in lines if not line.startswith("#")]
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9._-]*==\S+", line) for line in pins), pins
    local = dict(re.findall(r"^([a-z0-9][a-z0-9._-]*)==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M))
    assert {line.split("==")[0]: line.split("==")[1] for line in pins}.items() <= local.items()
    assert not any(line.startswith("apache-airflow") for line in pins), "Airflow pins its own distributions"


def test_dockerignore_keeps_local_state_out() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".triage/", ".venv/", "bench/results/", "**/__pycache__/"):
        assert entry in ignored, entry


def test_migrate_service_runs_the_triage_cli_once(services: dict[str, Any]) -> None:
    migrate = services["triage-migrate"]
    command = migrate["command"]
    argv = shlex.split(command) if isinstance(command, str) else command
    assert argv == ["python", "-m", "triage", "migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert migrate["environment"]["TRIAGE_DATABASE_URL"] == "postgresql://triage:triage@postgres:5432/triage"


@pytest.mark.parametrize("name", NEEDS_MIGRATED_DB)
def test_airflow_waits_for_the_migration(name: str, services: dict[str, Any]) -> None:
    depends_on = services[name]["depends_on"]
    assert depends_on["triage-migrate"] == {"condition": "service_completed_successfully"}
    assert depends_on["airflow-init"] == {"condition": "service_completed_successfully"}


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_waits_for_healthy_postgres_and_redis(name: str, services: dict[str, Any]) -> None:
    depends_on = services[name]["depends_on"]
    for backing in ("postgres", "redis"):
        assert depends_on[backing] == {"condition": "service_healthy"}, backing


@pytest.mark.parametrize("name", ["postgres", "redis"])
def test_backing_services_have_healthchecks(name: str, services: dict[str, Any]) -> None:
    test = services[name]["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL")


def test_postgres_is_healthy_only_after_its_init_scripts(services: dict[str, Any]) -> None:
    """During init the image's temporary server listens on the socket only; TCP means done."""
    postgres = services["postgres"]
    assert postgres["image"] == "postgres:16"
    test = postgres["healthcheck"]["test"]
    assert test[:2] == ["CMD", "pg_isready"]
    assert test[test.index("-h") + 1] == "localhost"


@pytest.mark.parametrize(
    "name",
    ["airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer", "airflow-worker"],
)
def test_airflow_services_have_healthchecks(name: str, services: dict[str, Any]) -> None:
    assert services[name]["healthcheck"]["test"]


def test_volumes_mount_the_project_folders(common: dict[str, Any]) -> None:
    mounts = {target: source for source, target in (with_defaults(v).split(":")[:2] for v in common["volumes"])}
    for folder in ("dags", "plugins", "include", "logs", "config", "data"):
        assert mounts[f"/opt/airflow/{folder}"] == f"./{folder}", folder


def test_celery_executor_and_execution_api(common_env: dict[str, str]) -> None:
    assert common_env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert common_env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/"
    assert common_env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://")


def test_secrets_are_shared_and_overridable(common_env: dict[str, str]) -> None:
    for key, variable in (
        ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API_AUTH__JWT_SECRET"),
        ("AIRFLOW__CORE__FERNET_KEY", "FERNET_KEY"),
    ):
        match = _DEFAULTED.fullmatch(common_env[key])
        assert match, f"{key} needs ${{{variable}:-default}}"
        assert match[1] == variable
    fernet = base64.urlsafe_b64decode(with_defaults(common_env["AIRFLOW__CORE__FERNET_KEY"]))
    assert len(fernet) == 32, "the default Fernet key is not a valid key"


def test_common_environment_needs_no_env_file(common_env: dict[str, str]) -> None:
    """Every ``${VAR}`` has a default, so a fresh clone starts without a .env file."""
    for key, value in common_env.items():
        assert "${" not in with_defaults(str(value)), f"{key} has a placeholder without a default"


def test_triage_db_connection(common_env: dict[str, str]) -> None:
    conn = json.loads(with_defaults(common_env["AIRFLOW_CONN_TRIAGE_DB"]))
    assert conn["conn_type"] == "postgres"
    assert conn["schema"] == "triage"
    assert conn["host"] == "postgres"
    assert conn["login"] == "triage_app", "Airflow must use the least-privilege role"
    assert init_sql_roles()["triage_app"] == conn["password"]


@pytest.mark.parametrize(
    ("env", "login"),
    [
        pytest.param("AIRFLOW_CONN_TRIAGE_DB_REVIEW", "triage_review", id="review"),
        pytest.param("AIRFLOW_CONN_TRIAGE_DB_MAINTENANCE", "triage_maintenance", id="maintenance"),
    ],
)
def test_each_job_has_its_database_login(common_env: dict[str, str], env: str, login: str) -> None:
    """Reviewers' decisions and retention log in as the one role the database lets do them."""
    conn = json.loads(with_defaults(common_env[env]))
    assert (conn["conn_type"], conn["host"], conn["schema"], conn["login"]) == ("postgres", "postgres", "triage", login)
    assert init_sql_roles()[login] == conn["password"]


def test_triage_database_urls_match_the_roles(common_env: dict[str, str], services: dict[str, Any]) -> None:
    roles = init_sql_roles()
    for url in (common_env["TRIAGE_DATABASE_URL"], services["triage-migrate"]["environment"]["TRIAGE_DATABASE_URL"]):
        match = re.fullmatch(r"postgresql://(\w+):([^@]*)@postgres:5432/triage", url)
        assert match, url
        assert roles[match[1]] == match[2], url


def test_triage_llm_connection(common_env: dict[str, str]) -> None:
    raw = common_env["AIRFLOW_CONN_TRIAGE_LLM"]
    assert "${TRIAGE_LLM_URL:-" in raw
    conn = json.loads(with_defaults(raw))
    assert conn["conn_type"] == "http"
    assert conn["host"].startswith("http")
    assert set(conn["extra"]) == {"model", "temperature", "timeout", "prompt_version"}


def test_triage_home_is_on_the_data_volume(common_env: dict[str, str]) -> None:
    assert common_env["TRIAGE_HOME"] == "/opt/airflow/data"


@pytest.mark.parametrize("name", COMMON_SERVICES)
def test_the_failure_drill_is_off_and_documented(
    name: str, services: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from triage import settings

    env = {k: with_defaults(str(v)) for k, v in services[name]["environment"].items()}
    assert settings.ENV_ALLOW_DRILL not in env
    for key in list(os.environ):
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert settings.drill_allowed() is False
    # Off, and the way to turn it on is written next to it (commented out).
    assert re.search(r"^\s*# TRIAGE_ALLOW_DRILL: '1'$", COMPOSE_FILE.read_text(), re.M)


@pytest.mark.parametrize("name", COMMON_SERVICES)
def test_inbox_roots_are_mounted_folders(
    name: str, common: dict[str, Any], services: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from triage import settings

    monkeypatch.setenv(settings.ENV_INBOX_ROOTS, services[name]["environment"][settings.ENV_INBOX_ROOTS])
    roots = settings.inbox_roots()
    mounts = [with_defaults(volume).split(":")[1] for volume in common["volumes"]]
    assert roots == ("/opt/airflow/data/inbox", "/opt/airflow/include/sample_inbox")
    for root in roots:
        assert any(root.startswith(f"{mount}/") for mount in mounts), root


def test_init_sql_creates_the_triage_database_and_roles(services: dict[str, Any]) -> None:
    assert "./docker/postgres-init:/docker-entrypoint-initdb.d:ro" in services["postgres"]["volumes"]
    sql = INIT_SQL.read_text()
    assert re.search(r"^CREATE DATABASE triage OWNER triage;$", sql, re.M)
    assert set(init_sql_roles()) == {"triage", "triage_app", "triage_review", "triage_maintenance"}
    assert re.search(r"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO triage_app;", sql)
    assert not re.search(r"GRANT\s+(ALL|CREATE)\b[^;]*\btriage_app\b", sql), "triage_app must not own or create"


def test_init_step_applies_the_settings_module(services: dict[str, Any]) -> None:
    init = services["airflow-init"]
    script = init["command"][-1]
    assert (
        "PYTHONPATH=/opt/triage:/opt/airflow/plugins /entrypoint python -m triage_tools.deploy.airflow_settings"
        " /opt/airflow/airflow_settings.yaml"
    ) in script
    assert importlib.util.find_spec("triage_tools.deploy.airflow_settings") is not None
    # The developer tools are not in the image: only this one-shot service mounts them.
    assert TOOLS_MOUNT in init["volumes"]
    mounting = [
        name for name, service in services.items() if any("triage_tools" in str(v) for v in service.get("volumes", []))
    ]
    assert mounting == ["airflow-init"]


def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client on PATH")
    if subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("the docker client has no compose plugin (`docker compose version` fails)")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr


def test_init_step_provisions_reconcile_jobs_api_user(services: dict[str, Any], common_env: dict[str, str]) -> None:
    """airflow-init makes the role, the user and the airflow_api connection (the FabAuthManager's;
    tests/drills/test_reconcile_user_fab.py runs the same step against a real FAB API server)."""
    from triage_tools.deploy import reconcile_user

    script = services["airflow-init"]["command"][-1]
    step = "PYTHONPATH=/opt/triage:/opt/airflow/plugins /entrypoint python -m triage_tools.deploy.reconcile_user fab || exit 1"
    assert step in script
    # After the metadata DB exists (the entrypoint's migration, the settings), before the ownership change.
    assert script.index("triage_tools.deploy.airflow_settings") < script.index(step) < script.index("chown -R")
    assert importlib.util.find_spec("triage_tools.deploy.reconcile_user") is not None
    assert common_env["AIRFLOW__CORE__AUTH_MANAGER"].endswith(".FabAuthManager"), "the step makes FAB's role and user"
    # The connection is the one in the metadata DB: an AIRFLOW_CONN_AIRFLOW_API would shadow it.
    for name, service in services.items():
        assert reconcile_user.CONN_ENV not in (service.get("environment") or {}), name
    # It names the API server as the workers reach it already.
    assert f"{reconcile_user.COMPOSE_API_URL}/execution/" == common_env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]
    # Its password is made at every start, never written into the compose file or the checkout.
    assert not re.search(r"triage_reconcile\W*[:=]", COMPOSE_FILE.read_text())


def test_reconcile_jobs_starts_unpaused_where_new_dags_start_paused(common_env: dict[str, str]) -> None:
    """New DAGs start paused here, the backstop never does: its DAG says so, and that wins
    (tests/airflow/test_dag_integrity.py shows it on Airflow's own DAG processor)."""
    import ast

    assert common_env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] == "true"
    decided = {}
    for dag_file in ("reconcile_jobs", "classify_documents"):
        tree = ast.parse((ROOT / "dags" / f"{dag_file}.py").read_text())
        (value,) = [
            k.value for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg == "is_paused_upon_creation"
        ]
        decided[dag_file] = ast.literal_eval(value)
    assert decided == {"reconcile_jobs": False, "classify_documents": True}


def test_the_api_server_serves_the_triage_plugin(services: dict[str, Any], common: dict[str, Any]) -> None:
    """The plugin (plugins/triage_plugin.py) runs inside the api-server: it needs the plugins and
    include folders (templates, taxonomy), the job database, the payloads (TRIAGE_HOME on the data
    volume) and the JWT key the form tokens are signed with, shared by every API server process."""
    api = services["airflow-apiserver"]
    assert api["command"] == "api-server"
    assert api["volumes"] == common["volumes"]
    assert (ROOT / "plugins" / "triage_plugin.py").exists()
    env = api["environment"]
    for key in ("AIRFLOW_CONN_TRIAGE_DB", "TRIAGE_HOME", "AIRFLOW__API_AUTH__JWT_SECRET"):
        assert env.get(key), key
