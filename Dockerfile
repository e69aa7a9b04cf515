# The Triage image: the official Airflow image extended with the project's pinned requirements
# and code (https://airflow.apache.org/docs/docker-stack/build.html, "Extending the image").
# Built by `docker compose build` (docker-compose.yaml: `build: .`). Keep the Airflow version and
# the Python version in step with requirements.txt and constraints.txt (tests/unit/test_compose.py).
FROM apache/airflow:3.3.2-python3.11

# pip runs as the airflow user, as the upstream guide requires; COPY itself runs as root.
USER airflow

COPY requirements.txt constraints.txt /
# "apache-airflow==${AIRFLOW_VERSION}" (set by the base image) makes pip refuse, rather than
# perform, an accidental upgrade or downgrade of Airflow itself.
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" \
        -r /requirements.txt -c /constraints.txt

COPY --chown=airflow:root plugins/ /opt/airflow/plugins/
COPY --chown=airflow:root dags/ /opt/airflow/dags/
COPY --chown=airflow:root include/ /opt/airflow/include/
COPY --chown=airflow:root airflow_settings.yaml /opt/airflow/airflow_settings.yaml

# Airflow puts the plugins folder on sys.path itself; plain `python -m triage ...` (the
# triage-migrate service) needs it spelled out. The developer tools (triage_tools/) are never
# copied: airflow-init mounts them from the checkout for its settings step (tests/unit/test_layout.py).
ENV PYTHONPATH="/opt/airflow/plugins"
