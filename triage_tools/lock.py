"""Refresh the two pin files (``make lock``): Airflow's constraints for the image, then the local lock.

1. ``docker/airflow-constraints.txt``: Airflow's official constraints for the Airflow version of
   requirements.txt and the Python of the Dockerfile's base image, downloaded from the
   ``constraints-X.Y.Z`` tag of apache/airflow. Where that download fails (a machine that
   reaches package indexes only), a stand-in is resolved instead, and its header says so: what
   pip resolves for Airflow and its providers from the packages that existed at the release.
2. ``constraints.txt``: the local lock for ``make setup``, valid on every Python that
   pyproject.toml supports. The runtime set is resolved under Airflow's constraints (so the
   virtualenv runs the image's versions), the development set under those pins; for the oldest
   supported Python first, then checked (and completed) on each newer one.

pip does the resolving, in dry-run mode with ``--report`` (nothing is installed), for Linux
wheels only (``--only-binary=:all:``): the image is Debian, and the developers' machines and CI
are Linux. tests/packaging/test_resolution.py uses the same helpers to prove both files resolve.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
REQUIREMENTS = ROOT / "requirements.txt"
REQUIREMENTS_DEV = ROOT / "requirements-dev.txt"
LOCAL_LOCK = ROOT / "constraints.txt"
AIRFLOW_CONSTRAINTS = ROOT / "docker" / "airflow-constraints.txt"
OFFICIAL_URL = "https://raw.githubusercontent.com/apache/airflow/constraints-{airflow}/constraints-{python}.txt"
# When each Airflow release was published (its upload, plus an hour for the constraints tag):
# the stand-in takes only packages uploaded before, as the official file was made at release.
RELEASED = {"3.3.2": "2026-09-17T09:38:26Z"}
STAND_IN_MARK = "NOT Airflow's official constraints file."
GLIBC_MINORS = range(17, 37)  # manylinux_2_17 (CentOS 7 era) .. 2_36 (Debian 12, the image's base)


class LockError(RuntimeError):
    """pip could not resolve a set, or a project file says something unexpected."""


def airflow_version() -> str:
    match = re.search(r"^apache-airflow==([\w.]+)\s*$", REQUIREMENTS.read_text(), re.M)
    if not match:
        raise LockError("requirements.txt pins no apache-airflow==X")
    return match[1]


def dockerfile_instructions() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def image_python() -> str:
    """``3.13`` from ``FROM apache/airflow:3.3.2-python3.13``."""
    (base,) = [line.split()[1] for line in dockerfile_instructions() if line.upper().startswith("FROM ")]
    match = re.fullmatch(r"apache/airflow:([\w.]+)-python(3\.\d+)", base)
    if not match:
        raise LockError(f"the Dockerfile's base image {base} names no Python version")
    return match[2]


def supported_pythons() -> list[str]:
    """The CPython versions of pyproject.toml's classifiers, oldest first."""
    classifiers = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["classifiers"]
    found = [
        c.rsplit("::", 1)[1].strip()
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    return sorted(found, key=lambda v: tuple(map(int, v.split("."))))


def image_pip_arguments() -> list[str]:
    """The requirement arguments of the Dockerfile's ``pip install``, with the files it copied
    into the image mapped back to the repository and ``${AIRFLOW_VERSION}`` filled in."""
    instructions = dockerfile_instructions()
    copied: dict[str, Path] = {}
    for line in instructions:
        if line.upper().startswith("COPY ") and "--chown" not in line:
            *sources, target = shlex.split(line)[1:]
            for source in sources:
                copied[target.rstrip("/") + "/" + Path(source).name] = ROOT / source
    (pip,) = [line for line in instructions if line.startswith("RUN ") and "pip install" in line]
    argv = shlex.split(pip.removeprefix("RUN "))
    argv = argv[argv.index("install") + 1 :]
    out: list[str] = []
    for arg in argv:
        if arg.startswith("--") and arg not in ("-r", "-c"):
            continue  # --no-cache-dir and the like: not part of the requirement set
        arg = arg.replace("${AIRFLOW_VERSION}", airflow_version())
        out.append(str(copied[arg]) if arg in copied else arg)
    return out


def platforms(arch: str = "x86_64") -> list[str]:
    """pip's ``--platform`` takes tags literally: every manylinux tag a Debian 12 machine accepts."""
    tags = [f"manylinux_2_{minor}_{arch}" for minor in reversed(GLIBC_MINORS)] + [f"manylinux2014_{arch}"]
    return [arg for tag in tags for arg in ("--platform", tag)]


# Run as ``python -c`` by this interpreter when no CPython of the target runs here: its pip, with
# the marker environment of CPython ``sys.argv[1]`` (see resolve()). pip has no option for it; Marker.evaluate
# looks default_environment up in its module at each call, so replacing it there reaches every
# marker pip evaluates. The check below makes a pip release where that no longer holds fail loudly
# instead of resolving as the host.
MARKER_OVERRIDE = """
import sys
from pip._vendor.packaging import markers
target = sys.argv.pop(1)
host = markers.default_environment
def default_environment():
    return {**host(), "python_version": target, "python_full_version": target + ".0",
            "implementation_version": target + ".0"}
markers.default_environment = default_environment
if not markers.Marker(f"python_version == '{target}'").evaluate():
    sys.exit(f"triage_tools/lock.py: this pip ignores the marker override for Python {target}")
from pip._internal.cli.main import main
sys.argv[0] = "pip"
sys.exit(main())
"""


def pip_package() -> Path:
    spec = importlib.util.find_spec("pip")
    if spec is None or not spec.submodule_search_locations:
        raise LockError(f"{sys.executable} has no pip")
    return Path(spec.submodule_search_locations[0])


@functools.cache
def interpreter(python: str) -> str | None:
    """A CPython ``python`` (``3.13``) that runs on this machine: this one, else a ``python3.X``
    under pyenv's versions (by full path: pyenv's shims may refuse to run) or on PATH."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == python and sys.implementation.name == "cpython":
        return sys.executable
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = sorted(pyenv_root.glob(f"versions/*/bin/python{python}"), reverse=True)
    candidates += [Path(found) for found in [shutil.which(f"python{python}")] if found]
    probe = "import sys; print(sys.implementation.name, *sys.version_info[:2], sep='.')"
    for candidate in candidates:
        try:
            said = subprocess.run([candidate, "-c", probe], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if said.returncode == 0 and said.stdout.strip() == f"cpython.{python}":
            return str(candidate)
    return None


def resolve(
    arguments: list[str],
    python: str,
    *,
    arch: str = "x86_64",
    uploaded_prior_to: str | None = None,
    isolated: bool = False,
) -> dict[str, str]:
    """What ``pip install ARGUMENTS`` would install on CPython ``python`` (Linux ``arch``), as
    ``{name: version}``; raises LockError with pip's explanation when the set does not resolve.

    pip's ``--python-version`` and ``--platform`` choose wheel tags and check Requires-Python, but
    pip evaluates environment markers (``pyyaml-ft; python_version == "3.13"``) against the
    interpreter that runs it. So pip runs under a CPython of the target version when one runs on
    this machine (interpreter()): this process's pip package, put on that interpreter's path, so
    every Python resolves with one pip release (the pyenv interpreters' own pips are too old for
    ``--uploaded-prior-to``, and resolvers differ between releases). Where none is found (3.14
    here), pip runs under this interpreter with MARKER_OVERRIDE, which pip offers no option for:
    ``python_version`` is the target's, ``python_full_version`` and ``implementation_version``
    are ``X.Y.0``, so a marker on a patch release (``python_full_version >= "3.14.1"``) is read
    as on 3.14.0.

    Either way the other markers are this machine's, not the target's: ``platform_machine``
    (x86_64 here, also when ``arch`` is aarch64), ``platform_release``, ``platform_version``
    and, off Linux, ``sys_platform``, ``platform_system`` and ``os_name``."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        options = [
            "install",
            "--dry-run",
            "--quiet",
            "--ignore-installed",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            "--python-version",
            python,
            *platforms(arch),
            "--report",
            str(report),
        ]
        if uploaded_prior_to:
            options += ["--uploaded-prior-to", uploaded_prior_to]
        env = dict(os.environ)
        if isolated:  # the package index alone: no local wheel folders or extra indexes
            env["PIP_CONFIG_FILE"] = os.devnull
            for key in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
                env.pop(key, None)
        target = interpreter(python)
        if target == sys.executable:
            command = [sys.executable, "-m", "pip"]
        else:  # this process's pip, alone on the path ahead of the interpreter's own
            pip_path = Path(tmp) / "pip-only"
            pip_path.mkdir()
            (pip_path / "pip").symlink_to(pip_package(), target_is_directory=True)
            env["PYTHONPATH"] = str(pip_path)
            command = [target, "-m", "pip"] if target else [sys.executable, "-c", MARKER_OVERRIDE, python]
        result = subprocess.run([*command, *options, *arguments], capture_output=True, text=True, env=env, timeout=900)
        if result.returncode != 0:
            noise = "WARNING: Location "  # local index folders that lack a package: not the point
            said = "\n".join(line for line in result.stderr.splitlines() if not line.startswith(noise))
            raise LockError(f"pip could not resolve {' '.join(arguments)} for Python {python} ({arch}):\n{said}")
        installed = json.loads(report.read_text())["install"]
    return {item["metadata"]["name"]: item["metadata"]["version"] for item in installed}


def write_pins(path: Path, header: list[str], pins: dict[str, str]) -> None:
    lines = [f"# {line}" if line else "#" for line in header]
    lines += [f"{name}=={version}" for name, version in sorted(pins.items(), key=lambda kv: kv[0].lower())]
    path.write_text("\n".join(lines) + "\n")


def refresh_airflow_constraints() -> None:
    airflow, python = airflow_version(), image_python()
    url = OFFICIAL_URL.format(airflow=airflow, python=python)
    today = dt.date.today().isoformat()
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            official = response.read().decode()
    except OSError as error:
        print(f"the official constraints are out of reach ({error}); resolving a stand-in", file=sys.stderr)
    else:
        AIRFLOW_CONSTRAINTS.write_text(
            f"# Airflow's official constraints for apache-airflow=={airflow} on Python {python}, unchanged\n"
            f"# below this header. Source: {url} (downloaded {today} by `make lock`).\n" + official
        )
        return
    if airflow not in RELEASED:
        raise LockError(f"triage_tools/lock.py: add apache-airflow {airflow}'s release time to RELEASED")
    providers = [
        line.split(">=")[0].split("==")[0].strip()
        for line in REQUIREMENTS.read_text().splitlines()
        if line.startswith("apache-airflow-providers-")
    ]
    airflow_spec = next(a for a in image_pip_arguments() if a.startswith("apache-airflow["))
    pins = resolve([airflow_spec, *providers], python, uploaded_prior_to=RELEASED[airflow], isolated=True)
    write_pins(
        AIRFLOW_CONSTRAINTS,
        [
            STAND_IN_MARK,
            f"A stand-in made by triage_tools/lock.py (`make lock`) on {today}, because the official file,",
            f"  {url}",
            "could not be downloaded on the machine that ran it (it reaches package indexes only).",
            f"It pins what pip resolves for {airflow_spec} and the providers of requirements.txt",
            *(f"  {provider}" for provider in providers),
            f"on CPython {python}, manylinux x86_64, from the packages uploaded before",
            f"{RELEASED[airflow]} (apache-airflow {airflow}'s release). The official file covers every",
            "provider, made by Airflow's release tooling at that time: versions may differ.",
            "Replace this file: run `make lock` where that URL is reachable.",
        ],
        pins,
    )


def refresh_local_lock() -> None:
    pythons = supported_pythons()
    oldest, newer = pythons[0], pythons[1:]
    with tempfile.TemporaryDirectory() as tmp:
        runtime_pins = Path(tmp) / "runtime.txt"
        runtime = resolve(["-r", str(REQUIREMENTS), "-c", str(AIRFLOW_CONSTRAINTS)], oldest)
        write_pins(runtime_pins, [], runtime)
        pins = resolve(["-r", str(REQUIREMENTS_DEV), "-c", str(runtime_pins)], oldest)
        for python in newer:
            write_pins(runtime_pins, [], pins)
            extra = resolve(["-r", str(REQUIREMENTS_DEV), "-c", str(runtime_pins)], python)
            pins.update({name: version for name, version in extra.items() if name not in pins})
    write_pins(
        LOCAL_LOCK,
        [
            "The local lock: every package `make setup` installs (requirements-dev.txt), on CPython",
            f"{', '.join(pythons)}. Made by `make lock` (triage_tools/lock.py): the runtime set follows",
            "docker/airflow-constraints.txt, Airflow's pins for the image, so the virtualenv runs the",
            "image's versions. tests/packaging/test_resolution.py resolves it on every Python.",
        ],
        pins,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m triage_tools.lock", description=__doc__.split("\n\n")[0])
    parser.add_argument("--local-only", action="store_true", help="keep docker/airflow-constraints.txt as it is")
    args = parser.parse_args(argv)
    try:
        if not args.local_only:
            refresh_airflow_constraints()
        refresh_local_lock()
    except LockError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"wrote {AIRFLOW_CONSTRAINTS.relative_to(ROOT)} and {LOCAL_LOCK.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
