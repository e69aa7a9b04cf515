"""Refresh the pin files (``make lock``) with uv's resolver (``uv pip compile``, a development tool).

The image installs under the constraints file that the official base image carries
(``${HOME}/constraints.txt`` of ``apache/airflow:X-pythonY``, the one Airflow's release tooling
made), plus ``docker/triage-constraints.txt``: Triage's own pins, only for packages that file pins
nothing for. Both feed the local lock when Airflow's file is at hand:

1. Airflow's constraints for the Airflow of requirements.txt and the Python of the Dockerfile's
   base image: ``--airflow-constraints FILE`` (a copy taken from the image:
   ``docker run --rm apache/airflow:3.3.2-python3.13 cat /home/airflow/constraints.txt``), else
   downloaded from the ``constraints-X.Y.Z`` tag of apache/airflow.
2. ``docker/triage-constraints.txt``: what the image set resolves to, for the packages Airflow's
   file leaves out.
3. ``constraints.txt``: the local lock for ``make setup``, valid on every Python that
   pyproject.toml supports: the runtime set resolved under Airflow's pins (so the virtualenv
   runs the image's versions), the development set under those, for the oldest supported Python
   first, then checked (and completed) on each newer one.

Where Airflow's file is out of reach (a machine that reaches package indexes only), the
Triage pin file is kept and the local lock is resolved holding its current pins: new
requirements get pinned, pinned ones keep their versions. It says so.

uv resolves for a target Python and platform without running it (``--python-version``,
``--python-platform``), markers included, for Linux wheels only (``--only-binary :all:``): the
image is Debian, and the developers' machines and CI are Linux. tests/drills/test_resolution.py
uses the same helpers to prove the files resolve.
"""

from __future__ import annotations

import argparse
import functools
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
TRIAGE_CONSTRAINTS = ROOT / "docker" / "triage-constraints.txt"
# Where the official image keeps Airflow's constraints (the Dockerfile's `-c` names it).
IMAGE_CONSTRAINTS = "${HOME}/constraints.txt"
OFFICIAL_URL = "https://raw.githubusercontent.com/apache/airflow/constraints-{airflow}/constraints-{python}.txt"
# manylinux_2_36: Debian 12's glibc, the oldest the official image and the developers' machines run.
GLIBC = "manylinux_2_36"


class LockError(RuntimeError):
    """uv could not resolve a set, or a project file says something unexpected."""


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


def image_pip_command() -> list[str]:
    """The argv of the Dockerfile's ``pip install`` (``RUN pip install ... && pip check``)."""
    (run,) = [line for line in dockerfile_instructions() if line.startswith("RUN ") and "pip install" in line]
    argv = shlex.split(run.removeprefix("RUN "))
    end = argv.index("&&") if "&&" in argv else len(argv)
    return argv[:end]


def image_pip_arguments(airflow_constraints: Path) -> list[str]:
    """The requirement arguments of the Dockerfile's ``pip install``, with the files it copied
    into the image mapped back to the repository, the base image's constraints file mapped to
    ``airflow_constraints`` and ``${AIRFLOW_VERSION}`` filled in."""
    copied: dict[str, Path] = {IMAGE_CONSTRAINTS: airflow_constraints}
    for line in dockerfile_instructions():
        if line.upper().startswith("COPY ") and "--chown" not in line:
            *sources, target = shlex.split(line)[1:]
            for source in sources:
                copied[target.rstrip("/") + "/" + Path(source).name] = ROOT / source
    argv = image_pip_command()  # quotes removed, variables left for the image's shell
    out: list[str] = []
    for arg in argv[argv.index("install") + 1 :]:
        if arg.startswith("--"):
            continue  # --no-cache-dir and the like: not part of the requirement set
        arg = arg.replace("${AIRFLOW_VERSION}", airflow_version())
        out.append(str(copied[arg]) if arg in copied else arg)
    return out


@functools.cache
def interpreter(python: str) -> str | None:
    """A CPython ``python`` (``3.13``) that runs on this machine: this one, else a ``python3.X``
    under pyenv's versions (by full path: pyenv's shims may refuse to run) or on PATH. The lock
    needs none (uv resolves for a version it does not run); make's smoke test runs one."""
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


def uv() -> str:
    """The uv binary of the development requirements (the ``uv`` package ships it)."""
    try:
        from uv import find_uv_bin
    except ImportError as error:
        raise LockError(f"{sys.executable} has no uv: run `make setup` (requirements-dev.txt)") from error
    return str(find_uv_bin())


def resolve(arguments: list[str], python: str, *, arch: str = "x86_64") -> dict[str, str]:
    """What ``pip install ARGUMENTS`` would install on CPython ``python`` (Linux ``arch``), as
    ``{name: version}`` (names normalized); raises LockError with uv's explanation when the set
    does not resolve. ``-r FILE`` and ``-c FILE`` are read as pip reads them; any other argument
    is a requirement. The package index alone is asked (uv reads no pip configuration)."""
    files: list[str] = []
    constraints: list[str] = []
    specs: list[str] = []
    items = iter(arguments)
    for arg in items:
        if arg == "-r":
            files.append(next(items))
        elif arg == "-c":
            constraints += ["--constraint", next(items)]
        else:
            specs.append(arg)
    with tempfile.TemporaryDirectory() as tmp:
        if specs:
            direct = Path(tmp) / "requirements.in"
            direct.write_text("\n".join(specs) + "\n")
            files.append(str(direct))
        command = [
            uv(),
            "pip",
            "compile",
            *files,
            *constraints,
            "--python-version",
            python,
            "--python-platform",
            f"{arch}-{GLIBC}",
            "--only-binary",
            ":all:",
            "--no-header",
            "--no-annotate",
            "--quiet",
            "--no-config",
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp)
    if result.returncode != 0:
        raise LockError(f"uv could not resolve {' '.join(arguments)} for Python {python} ({arch}):\n{result.stderr}")
    return dict(re.findall(r"^([a-z0-9][a-z0-9._-]*)==(\S+)\s*$", result.stdout, re.M))


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9][\w.-]*)==(\S+)\s*$", path.read_text(), re.M)
    return {normalized(name): version for name, version in found}


def write_pins(path: Path, header: list[str], pins: dict[str, str]) -> None:
    lines = [f"# {line}" if line else "#" for line in header]
    lines += [f"{name}=={version}" for name, version in sorted(pins.items())]
    path.write_text("\n".join(lines) + "\n")


def fetch_airflow_constraints(target: Path) -> bool:
    """Airflow's official constraints for the image into ``target``; False when out of reach."""
    url = OFFICIAL_URL.format(airflow=airflow_version(), python=image_python())
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            target.write_bytes(response.read())
    except OSError as error:
        print(f"Airflow's constraints are out of reach ({error})", file=sys.stderr)
        return False
    return True


def refresh_triage_constraints(airflow_constraints: Path) -> None:
    """docker/triage-constraints.txt: the image set's versions where Airflow pins nothing."""
    airflow = read_pins(airflow_constraints)
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty.txt"
        empty.write_text("")
        # The image set without our own pins: they are what this computes.
        arguments = [
            str(empty) if arg == str(TRIAGE_CONSTRAINTS) else arg for arg in image_pip_arguments(airflow_constraints)
        ]
        resolved = resolve(arguments, image_python())
    own = {name: version for name, version in resolved.items() if name not in airflow}
    write_pins(TRIAGE_CONSTRAINTS, TRIAGE_HEADER, own)


TRIAGE_HEADER = [
    "Triage's own pins for the image, only for packages that Airflow's constraints (the base",
    "image's ${HOME}/constraints.txt) pin nothing for; the Dockerfile installs under both, so a",
    "package pinned in both files would make pip refuse the build. Written by `make lock`",
    "(triage_tools/lock.py) from Airflow's file; empty while Airflow pins all of requirements.txt.",
]


def refresh_local_lock(held: Path, *, hold_development: bool = False) -> None:
    """constraints.txt: the development set on every supported Python, its runtime part resolved
    under ``held`` (Airflow's and Triage's image pins, or the current lock's); with
    ``hold_development`` the development packages too (the current lock: nothing moves, new
    requirements get pinned)."""
    pythons = supported_pythons()
    oldest, newer = pythons[0], pythons[1:]
    with tempfile.TemporaryDirectory() as tmp:
        runtime_pins = Path(tmp) / "runtime.txt"
        runtime = resolve(["-r", str(REQUIREMENTS), "-c", str(held)], oldest)
        write_pins(runtime_pins, [], runtime)
        development = ["-r", str(REQUIREMENTS_DEV), "-c", str(runtime_pins)]
        if hold_development:
            development += ["-c", str(held)]
        pins = resolve(development, oldest)
        for python in newer:
            write_pins(runtime_pins, [], pins)
            extra = resolve(development, python)
            pins.update({name: version for name, version in extra.items() if name not in pins})
    header = [
        "The local lock: every package `make setup` installs (requirements-dev.txt), on CPython",
        f"{', '.join(pythons)}. Made by `make lock` (triage_tools/lock.py, uv's resolver)",
    ]
    if hold_development:  # Airflow's file was out of reach: say so, never claim its versions
        header += [
            "without Airflow's constraints for the image (out of reach): the pins it had were held",
            "and only new requirements pinned, so the image (which installs under Airflow's file)",
            "may run other versions; `make lock` with that file realigns it.",
        ]
    else:
        header += ["under Airflow's constraints for the image: the virtualenv runs the image's versions."]
    header += ["tests/drills/test_resolution.py resolves it on every Python."]
    write_pins(LOCAL_LOCK, header, pins)


def shown(path: Path) -> str:
    """``path`` relative to the checkout when it lies in it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m triage_tools.lock", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--airflow-constraints",
        type=Path,
        metavar="FILE",
        help="Airflow's constraints for the image (a copy of the base image's ${HOME}/constraints.txt); "
        "default: downloaded from apache/airflow's constraints tag",
    )
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            airflow = args.airflow_constraints
            if airflow is None:
                downloaded = Path(tmp) / "airflow-constraints.txt"
                airflow = downloaded if fetch_airflow_constraints(downloaded) else None
            if airflow is not None:
                refresh_triage_constraints(airflow)
                both = Path(tmp) / "image-constraints.txt"
                both.write_text(airflow.read_text() + "\n" + TRIAGE_CONSTRAINTS.read_text())
                refresh_local_lock(both)
                print(f"wrote {shown(TRIAGE_CONSTRAINTS)} and {shown(LOCAL_LOCK)}")
            else:
                held = Path(tmp) / "held.txt"
                shutil.copyfile(LOCAL_LOCK, held)
                refresh_local_lock(held, hold_development=True)
                print(
                    f"wrote {shown(LOCAL_LOCK)}, holding its pins (without Airflow's constraints; "
                    f"{shown(TRIAGE_CONSTRAINTS)} kept as it is)"
                )
    except LockError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
