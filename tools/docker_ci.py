"""A Docker engine and PostgreSQL images for the Docker tests, on a machine that has neither.

``python3 -m tools.docker_ci run CMD...`` (``make docker``, and ``.ci/run`` around the
whole suite) makes sure an engine answers, builds the images the tests ask for, runs
CMD with testcontainers told not to pull its reaper (Ryuk comes from a registry, and no
registry is reachable here), and then undoes what it did: the dockerd it started is
stopped by its pid, and the bridge, iptables rules and forwarding switch dockerd set up
are put back as they were. An engine that was already running is used and left alone.

The images are built from Debian's packages, since no registry is reachable either:
``mmdebstrap --variant=minbase`` makes a root file system with PostgreSQL, ``docker
import`` turns it into a base image, and ``tools/docker/Dockerfile`` adds an entrypoint
that honours ``POSTGRES_USER/PASSWORD/DB`` as the official image does. Images persist in
the engine's own storage, so a second run builds nothing; the entrypoint's recipe is a
label, so changing it rebuilds only the small top layer. An image of that name that is
not ours (the official one, pulled by a developer) is used as it is.

Standard library only: it runs before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

RECIPE_DIR = Path(__file__).resolve().parent / "docker"
SOCKET = Path("/var/run/docker.sock")


@dataclass(frozen=True)
class Image:
    tag: str
    suite: str
    major: str

    @property
    def base(self) -> str:
        return f"pgrace-base:{self.suite}-pg{self.major}"


#: What the Docker tests and the README's examples start: Debian's PostgreSQL of each release.
IMAGES = (Image("postgres:15", "bookworm", "15"), Image("postgres:17", "trixie", "17"))


def say(message: str) -> None:
    print(f"docker_ci: {message}", file=sys.stderr, flush=True)


def docker_cli() -> str:
    """The client beside Debian's dockerd when there is one (it speaks the engine's API version)."""
    for candidate in ("/usr/bin/docker", shutil.which("docker")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit("docker_ci: no docker client (apt-get install docker.io)")


def engine_answers(docker: str) -> bool:
    return subprocess.run([docker, "info"], capture_output=True, check=False).returncode == 0


_apt_updated = False


def apt_install(*packages: str) -> None:
    """Install Debian packages (as root, like CI); the package lists are refreshed once."""
    global _apt_updated
    if os.geteuid() != 0:
        names = " ".join(packages)
        raise SystemExit(f"docker_ci: {names} missing; install them as root: apt-get install {names}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _apt_updated:
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        _apt_updated = True
    say(f"installing {' '.join(packages)}")
    subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=env, stdout=subprocess.DEVNULL)


def _sbin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in ("/usr/sbin", "/sbin", "/usr/bin"):
        if os.access(f"{folder}/{name}", os.X_OK):
            return f"{folder}/{name}"
    return None


@dataclass
class NetworkState:
    """What dockerd changes in the host's network at start, read before it starts."""

    tables: dict[tuple[str, str], str]  # (iptables-save command, table) -> its rules
    bridge_existed: bool
    ip_forward: str

    @classmethod
    def read(cls) -> NetworkState:
        tables: dict[tuple[str, str], str] = {}
        for save in ("iptables-save", "ip6tables-save"):
            if _sbin(save) is None:
                continue
            for table in ("filter", "nat"):
                out = subprocess.run([save, "-t", table], capture_output=True, text=True, check=False)
                if out.returncode == 0:
                    tables[(save, table)] = out.stdout
        return cls(
            tables=tables,
            bridge_existed=Path("/sys/class/net/docker0").exists(),
            ip_forward=Path("/proc/sys/net/ipv4/ip_forward").read_text().strip(),
        )

    def restore(self) -> None:
        for (save, _table), rules in self.tables.items():
            restore = _sbin(save.replace("-save", "-restore"))
            if restore is not None:
                subprocess.run([restore], input=rules, text=True, check=False)
        if not self.bridge_existed and Path("/sys/class/net/docker0").exists():
            subprocess.run(["ip", "link", "delete", "docker0"], check=False)
        with suppress(OSError):
            Path("/proc/sys/net/ipv4/ip_forward").write_text(self.ip_forward + "\n")


@contextmanager
def engine(docker: str) -> Iterator[None]:
    """A Docker engine for the block: the running one, or a dockerd started now and stopped after."""
    if engine_answers(docker):
        say("using the Docker engine already running")
        yield
        return
    dockerd = _sbin("dockerd")
    if dockerd is None:
        apt_install("docker.io")
        dockerd = _sbin("dockerd")
        if dockerd is None:
            raise SystemExit("docker_ci: docker.io installed but no dockerd found")
        docker = docker_cli()
    network = NetworkState.read()
    log = tempfile.NamedTemporaryFile(prefix="dockerd-", suffix=".log", delete=False)  # noqa: SIM115
    started = time.monotonic()
    # A session of its own: a Ctrl-C meant for the tests must not stop the engine before they clean up.
    process = subprocess.Popen([dockerd], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    containerd: int | None = None
    try:
        while not engine_answers(docker):
            if process.poll() is not None or time.monotonic() - started > 60:
                log.flush()
                tail = Path(log.name).read_text(errors="replace").splitlines()[-15:]
                raise SystemExit("docker_ci: dockerd did not start:\n" + "\n".join(tail))
            time.sleep(0.1)
        containerd = _managed_containerd()
        say(f"started dockerd (pid {process.pid}) in {time.monotonic() - started:.1f} s")
        yield
    finally:
        _remove_leftovers(docker)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if containerd is not None and _is_running(containerd, "containerd"):
            os.kill(containerd, signal.SIGTERM)
        network.restore()
        log.close()
        os.unlink(log.name)
        say(f"stopped dockerd (pid {process.pid}) and restored the network")


def _managed_containerd() -> int | None:
    """The containerd dockerd started for itself (it normally stops it too)."""
    with suppress(OSError, ValueError):
        return int(Path("/var/run/docker/containerd/containerd.pid").read_text().strip())
    return None


def _is_running(pid: int, name: str) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == name
    except OSError:
        return False


def _remove_leftovers(docker: str) -> None:
    """Containers pgrace left are a bug the tests report; the machine is cleaned anyway."""
    out = subprocess.run(
        [docker, "ps", "-aq", "--filter", "label=org.pgrace.container"], capture_output=True, text=True, check=False
    )
    ids = out.stdout.split()
    if ids:
        say(f"removing {len(ids)} container(s) pgrace left behind: {' '.join(ids)}")
        subprocess.run([docker, "rm", "-f", *ids], capture_output=True, check=False)


def recipe() -> str:
    digest = hashlib.sha256()
    for name in ("Dockerfile", "docker-entrypoint.sh"):
        digest.update((RECIPE_DIR / name).read_bytes())
    return digest.hexdigest()[:16]


def _inspect(docker: str, ref: str, template: str) -> str | None:
    out = subprocess.run([docker, "image", "inspect", "-f", template, ref], capture_output=True, text=True, check=False)
    return out.stdout.strip() if out.returncode == 0 else None


def debian_mirror() -> str:
    """The mirror this machine's apt uses (CI's machine reaches the same one)."""
    if os.environ.get("PGRACE_DEBIAN_MIRROR"):
        return os.environ["PGRACE_DEBIAN_MIRROR"]
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    listing = Path("/etc/apt/sources.list")
    if listing.exists():
        for line in listing.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and "debian" in parts[1] and "security" not in parts[1]:
                return parts[1]
    return "http://deb.debian.org/debian"


def build_base(docker: str, image: Image) -> None:
    """A minimal Debian with PostgreSQL, straight from the packages, as an image."""
    if _sbin("mmdebstrap") is None:
        apt_install("mmdebstrap")
    package = f"postgresql-{image.major}"
    command = [
        "mmdebstrap",
        "--quiet",
        "--variant=minbase",
        f"--include={package}",
        *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "info", "locale")),
        # The package makes a "main" cluster of its own; the entrypoint makes the one the container uses.
        f'--customize-hook=rm -rf "$1/var/lib/postgresql/{image.major}" "$1/etc/postgresql/{image.major}"',
        '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
        image.suite,
        "-",
        debian_mirror(),
    ]
    make = subprocess.Popen(command, stdout=subprocess.PIPE)
    imported = subprocess.run([docker, "import", "-", image.base], stdin=make.stdout, capture_output=True, check=False)
    assert make.stdout is not None
    make.stdout.close()
    if make.wait() != 0 or imported.returncode != 0:
        subprocess.run([docker, "rmi", image.base], capture_output=True, check=False)
        raise SystemExit(f"docker_ci: could not build {image.base}: {imported.stderr.decode(errors='replace')}")


def ensure_image(docker: str, image: Image) -> None:
    """Build ``image`` unless the engine has it (ours of this recipe, or someone else's)."""
    wanted = recipe()
    label = _inspect(docker, image.tag, '{{index .Config.Labels "org.pgrace.recipe"}}')
    if label is not None and label in (wanted, "", "<no value>"):
        say(f"{image.tag}: present" + (" (not built by pgrace)" if label != wanted else ""))
        return
    started = time.monotonic()
    if _inspect(docker, image.base, "{{.Id}}") is None:
        build_base(docker, image)
    subprocess.run(
        [
            docker,
            "build",
            "--quiet",
            "--build-arg",
            f"BASE={image.base}",
            "--build-arg",
            f"PG_MAJOR={image.major}",
            "--build-arg",
            f"RECIPE={wanted}",
            "-t",
            image.tag,
            str(RECIPE_DIR),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},  # the classic builder needs no registry and no buildx
    )
    say(f"{image.tag}: built in {time.monotonic() - started:.1f} s")


def run(command: Sequence[str]) -> int:
    """Engine up, images there, ``command`` run, engine down: the command's exit code."""
    terminated: list[int] = []

    def on_term(signum: int, frame: FrameType | None) -> None:
        terminated.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    docker = docker_cli()
    try:
        with engine(docker):
            for image in IMAGES:
                ensure_image(docker, image)
            if not command:
                return 0
            env = {**os.environ, "TESTCONTAINERS_RYUK_DISABLED": "true"}
            env.setdefault("DOCKER_HOST", f"unix://{SOCKET}")
            child = subprocess.Popen(list(command), env=env)
            try:
                return child.wait()
            except KeyboardInterrupt:
                if terminated:
                    child.terminate()
                child.wait()  # Ctrl-C reached the child too: let it clean up first
                raise
    except KeyboardInterrupt:
        return 128 + (terminated[0] if terminated else signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tools.docker_ci", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    run_parser = sub.add_parser("run", help="engine up, images built, COMMAND run with it, engine down")
    run_parser.add_argument("command", nargs=argparse.REMAINDER, help="what to run (nothing: only build the images)")
    args = parser.parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    return run(command)


if __name__ == "__main__":
    sys.exit(main())
