# The Triage image: the official Airflow image extended with the project's requirements and code,
# as Airflow's guide shows it (https://airflow.apache.org/docs/docker-stack/build.html, "Extending
# the image"). Built by `docker compose build` (docker-compose.yaml: `build: .`).
# Python 3.13 is the default Python of the official 3.3.x images. The base image carries the
# constraints Airflow's release tooling made for this Airflow and this Python at
# ${HOME}/constraints.txt: the install runs under them, so the image keeps the versions the
# official image was built and tested with. docker/triage-constraints.txt adds Triage's own pins
# only for packages Airflow pins nothing for (`make lock`). `pip check` fails the build when
# the installed set is inconsistent. tests/unit/test_compose.py keeps this file honest (base tag,
# constraints, pip check); tests/drills/test_resolution.py resolves the requirement set.
# The embedded PostgreSQL and the test tools (requirements-dev.txt) stay out.
FROM apache/airflow:3.3.2-python3.13

# pip runs as the airflow user, as the upstream guide requires; COPY itself runs as root.
USER airflow

COPY requirements.txt docker/triage-constraints.txt /
# "apache-airflow==${AIRFLOW_VERSION}" (set by the base image) makes pip refuse, rather than
# perform, an accidental upgrade or downgrade of Airflow itself; [fab] is the FAB auth manager
# that docker-compose.yaml configures.
RUN pip install --no-cache-dir "apache-airflow[fab]==${AIRFLOW_VERSION}" -r /requirements.txt \
        -c "${HOME}/constraints.txt" -c /triage-constraints.txt \
    && pip check

COPY --chown=airflow:root plugins/ /opt/airflow/plugins/
COPY --chown=airflow:root dags/ /opt/airflow/dags/
COPY --chown=airflow:root include/ /opt/airflow/include/
COPY --chown=airflow:root airflow_settings.yaml /opt/airflow/airflow_settings.yaml

# Airflow puts the plugins folder on sys.path itself; plain `python -m triage ...` (the
# triage-migrate service) needs it spelled out. The developer tools (triage_tools/) are never
# copied: airflow-init mounts them from the checkout for its settings step (tests/unit/test_layout.py).
ENV PYTHONPATH="/opt/airflow/plugins"
