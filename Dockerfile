# The Triage image: the official Airflow image extended with the project's requirements and code,
# as Airflow's guide shows it (https://airflow.apache.org/docs/docker-stack/build.html, "Extending
# the image"). Built by `docker compose build` (docker-compose.yaml: `build: .`).
# Python 3.13 is the default Python of the official 3.3.x images. Airflow's constraints for this
# Airflow and this Python are vendored in docker/airflow-constraints.txt (`make lock` refreshes
# them); tests/packaging/test_resolution.py resolves this very pip command against them, and
# tests/unit/test_compose.py keeps the versions here, in requirements.txt and in the constraints
# in step. The embedded PostgreSQL and the test tools (requirements-dev.txt) stay out.
FROM apache/airflow:3.3.2-python3.13

# pip runs as the airflow user, as the upstream guide requires; COPY itself runs as root.
USER airflow

COPY requirements.txt docker/airflow-constraints.txt /
# "apache-airflow==${AIRFLOW_VERSION}" (set by the base image) makes pip refuse, rather than
# perform, an accidental upgrade or downgrade of Airflow itself; [fab] is the FAB auth manager
# that docker-compose.yaml configures.
RUN pip install --no-cache-dir "apache-airflow[fab]==${AIRFLOW_VERSION}" \
        -r /requirements.txt -c /airflow-constraints.txt

COPY --chown=airflow:root plugins/ /opt/airflow/plugins/
COPY --chown=airflow:root dags/ /opt/airflow/dags/
COPY --chown=airflow:root include/ /opt/airflow/include/
COPY --chown=airflow:root airflow_settings.yaml /opt/airflow/airflow_settings.yaml

# Airflow puts the plugins folder on sys.path itself; plain `python -m triage ...` (the
# triage-migrate service) needs it spelled out. The developer tools (triage_tools/) are never
# copied: airflow-init mounts them from the checkout for its settings step (tests/unit/test_layout.py).
ENV PYTHONPATH="/opt/airflow/plugins"
