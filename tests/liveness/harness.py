"""Real workers in the places where a process table lies or a clock steps.

A *world* is a directory every worker can write (workers may run under other uids): the store's
files, the tickets the tool really created (one file per execution), the ``entered`` marker of
the first worker inside the tool and the ``go`` file that lets it out. ``spawn`` starts
``worker.py`` behind a *place* — the command prefix that puts it in a mount, PID or time
namespace, or under another uid — in its own process group, which ``spawned`` kills whatever the
test's outcome.

Places need privileges (mount and PID namespaces, ``setpriv``); where they are missing the test
is skipped with a loud reason, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl

WORKER = Path(__file__).with_name("worker.py")
SESSION = "liveness-world"
TOOL_USE_ID = "toolu_liveness_1"

Place = Sequence[str]
PLAIN: Place = ()


def no_proc() -> Place:
    """A private mount namespace with an empty tmpfs over ``/proc``: a process table nobody can
    read, as on macOS, Windows or a container with a masked ``/proc``."""
    return (
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs none /proc && exec "$0" "$@"',
    )


def hidden_proc(uid: int) -> Place:
    """``/proc`` mounted with ``hidepid=2`` (a common hardening) and the worker running as
    ``uid``: it sees its own processes only."""
    return (
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount -t proc -o hidepid=2 proc /proc && "
        f'exec setpriv --reuid {uid} --regid {uid} --clear-groups "$0" "$@"',
    )


def container() -> Place:
    """A PID namespace with its own ``/proc`` (a container of this kernel: one boot id, its own
    process table)."""
    return ("unshare", "--pid", "--fork", "--mount-proc")


def pid_namespace_seeing_the_hosts_proc() -> Place:
    """A PID namespace without a ``/proc`` of its own (``unshare --pid`` without
    ``--mount-proc``): its processes' pids name other processes in the ``/proc`` it sees. Runs
    two workers one after the other (``spawn(..., then=...)``): the second starts when the first
    has ended, in the same namespace."""
    return ("unshare", "--pid", "--fork", "sh", "-c", '"$0" "$1" "$2"; exec "$0" "$1" "$3"')


def time_namespace(boottime: int) -> Place:
    """A time namespace whose boot-time clock runs ``boottime`` seconds ahead: the start times
    ``/proc/PID/stat`` shows there are shifted by as much."""
    return ("unshare", "--time", "--boottime", str(boottime), "--monotonic", str(boottime))


def require(probe: Sequence[str], what: str) -> None:
    """Skip (or, under CI=true, fail) unless ``probe`` succeeds."""
    try:
        done = subprocess.run(list(probe), capture_output=True, check=False, timeout=30)
        why = None if done.returncode == 0 else done.stderr.decode().strip() or "it failed"
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    if why is None:
        return
    reason = f"{what.upper()} NOT TESTED: {why} (needs root: mount, PID and time namespaces)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}. Under CI=true a skipped case is a failure.")
    pytest.skip(reason)


@dataclass
class World:
    dir: Path
    store: str

    @property
    def tickets(self) -> list[str]:
        return sorted(p.name for p in (self.dir / "tickets").iterdir())

    def entered(self) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = json.loads((self.dir / "entered").read_text())
        except (OSError, ValueError):
            return None
        return found

    def go(self) -> None:
        (self.dir / "go").touch()

    def step_clock(self, offset: float) -> None:
        """Set the wall-clock offset every worker of this world reads (``clock_file``)."""
        tmp = self.dir / "clock.tmp"
        tmp.write_text(repr(offset))
        tmp.replace(self.dir / "clock")

    @property
    def clock_file(self) -> str:
        return str(self.dir / "clock")


@contextlib.contextmanager
def world(kind: str, postgres_store_url: str | None = None) -> Iterator[World]:
    """A fresh world whose store is ``kind`` (sqlite, json or postgres)."""
    root = Path(tempfile.mkdtemp(prefix="tl-liveness-", dir="/tmp"))
    try:
        root.chmod(0o777)
        (root / "tickets").mkdir(mode=0o777)
        (root / "tickets").chmod(0o777)
        (root / "out").mkdir(mode=0o777)
        (root / "out").chmod(0o777)
        if kind == "sqlite":
            url = f"sqlite:///{root / 'store.db'}"
            # Made here, writable by every uid: SQLite creates its files 0644 whatever the
            # umask, and gives its -wal and -shm files the database file's permissions.
            tl.open_store(url).close()
            (root / "store.db").chmod(0o666)
        elif kind == "json":
            (root / "store").mkdir(mode=0o777)
            (root / "store").chmod(0o777)
            url = f"json:///{root / 'store'}"
        else:
            assert postgres_store_url is not None
            url = postgres_store_url
        yield World(root, url)
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Workers:
    """The workers a test started; all killed (process group and all) at its end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(
        self,
        w: World,
        name: str,
        *,
        place: Place = PLAIN,
        mode: str = "ledger",
        model_url: str | None = None,
        then: dict[str, Any] | None = None,
        **config: Any,
    ) -> Worker:
        """Start a worker named ``name`` in ``place``. ``then``: the config changes of a
        second worker the place runs after the first (``pid_namespace_seeing_the_hosts_proc``);
        its result is ``Worker.then``."""

        def cfg(name: str, extra: dict[str, Any]) -> dict[str, Any]:
            return {
                "mode": mode,
                "store": w.store,
                "session": SESSION,
                "tool_use_id": TOOL_USE_ID,
                "world": str(w.dir),
                "out": str(w.dir / "out" / f"{name}.json"),
                "model_url": model_url,
                **extra,
            }

        first = cfg(name, config)
        argv = [*place, sys.executable, str(WORKER), json.dumps(first)]
        second = None
        if then is not None:
            second = cfg(f"{name}-then", {**config, **then})
            argv.append(json.dumps(second))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        env.pop("TOOLLEDGER_HOST_ID", None)
        proc = subprocess.Popen(
            argv,
            env=env,
            start_new_session=True,  # its own process group: killed as one
        )
        self.procs.append(proc)
        worker = Worker(proc, Path(first["out"]))
        if second is not None:
            worker.then = Worker(proc, Path(second["out"]))
        return worker

    def kill_all(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    out: Path
    then: Worker | None = None

    def result(self, timeout: float = 60.0) -> dict[str, Any]:
        code = self.proc.wait(timeout)
        assert code == 0, f"the worker exited with {code}"
        found: dict[str, Any] = json.loads(self.out.read_text())
        return found

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def wait_entered(w: World, first: Worker, timeout: float = 60.0) -> dict[str, Any]:
    """Until the first worker is inside the tool (and holding there)."""
    deadline = time.monotonic() + timeout
    while True:
        found = w.entered()
        if found is not None:
            return found
        code = first.proc.poll()
        assert code is None, f"the first worker ended ({code}) before it reached its tool"
        assert time.monotonic() < deadline, "the first worker never reached its tool"
        time.sleep(0.01)
