"""Running things as the tests' unprivileged job users, as a site's users run them.

A site's users have no Slurm admin rights and no access to root's files, so the end-to-end
stories submit as `JOB_USER` (and a second account, `OTHER_USER`, plays someone else on the same
cluster). Commands run under `setpriv` with the user's own uid, gid and groups, the environment
given explicitly (nothing of root's leaks in) and an argv list, never a shell string.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

#: The job user the stories submit as; `OTHER_USER` is a second, unrelated account.
JOB_USER = "fthsdp-user"
OTHER_USER = "fthsdp-other"
USERS = (JOB_USER, OTHER_USER)
#: What every user's command gets besides what the caller passes (no root PATH entries).
BASE_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"


class UserSetupError(RuntimeError):
    """An account the tests need could not be made."""


def ensure_user(name: str) -> pwd.struct_passwd:
    """The account `name`, created as a system account without a home or login shell if it is
    missing. An existing account is used as it is and never changed or deleted."""
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    r = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    try:
        # Another test session may have made it at the same moment: the account is what counts.
        return pwd.getpwnam(name)
    except KeyError:
        raise UserSetupError(
            f"useradd {name} failed ({r.returncode}): {r.stderr.strip()}"
        ) from None


def user_env(user: str, home: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A user's environment from scratch: identity, PATH and HOME (`home`), then `env`."""
    return {
        "USER": user,
        "LOGNAME": user,
        "HOME": str(home),
        "PATH": BASE_PATH,
        "LANG": "C.UTF-8",
        **(env or {}),
    }


def user_argv(user: str, argv: Sequence[str]) -> list[str]:
    """`argv` run as `user` (uid, gid and supplementary groups) by setpriv."""
    entry = pwd.getpwnam(user)
    return [
        "setpriv",
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--init-groups",
        "--",
        *argv,
    ]


def as_user(
    user: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` as `user` with exactly `env`, in `cwd`; killed (its whole session) on timeout.

    `env` is the whole environment (see `user_env`); nothing of the caller's is passed on.
    """
    proc = subprocess.Popen(
        user_argv(user, argv),
        env=dict(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(list(argv), timeout, out, err) from None
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def user_folder(base: Path, user: str, name: str) -> Path:
    """A new folder `base/name` owned by `user` (0700), for the user's runs and logs.

    `base` must be traversable by every user (see `tests.conftest.open_folder`); root made it,
    so the user can write only inside the folder given to them.
    """
    entry = pwd.getpwnam(user)
    path = base / name
    path.mkdir(mode=0o700)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


class SiteUser:
    """One job user working through the site install: their folder, environment and commands.

    `fthsdp` is the site install's entry point run as the user with the user's own environment
    (the cluster's `SLURM_CONF`, nothing of root's), in their folder; `python` is the site
    install's interpreter, the one the spec's `python` and `[train] command` name.
    """

    def __init__(
        self, user: str, prefix: Path, home: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.user = user
        self.prefix = prefix
        self.home = home
        self.env = user_env(user, home, {"PATH": f"{prefix / 'bin'}:{BASE_PATH}", **(env or {})})

    @property
    def python(self) -> Path:
        return self.prefix / "bin" / "python"

    def with_env(self, **extra: str) -> SiteUser:
        """The same user with more environment (e.g. a test's knobs for the trainer)."""
        return SiteUser(self.user, self.prefix, self.home, {**self.env, **extra})

    def run(
        self, argv: Sequence[str], timeout: float = 120, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return as_user(self.user, argv, self.env, cwd or self.home, timeout)

    def fthsdp(
        self, *args: str, timeout: float = 120, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.run([str(self.prefix / "bin" / "fthsdp"), *args], timeout, cwd)

    def folder(self, name: str) -> Path:
        """A new folder of the user's inside their own."""
        path = self.home / name
        self.run(["mkdir", "-m", "0700", str(path)], timeout=30).check_returncode()
        return path

    def write(self, path: Path, text: str) -> None:
        """`text` into `path` as root, then given to the user (a spec the user submits)."""
        path.write_text(text)
        entry = pwd.getpwnam(self.user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


class UserCommandError(RuntimeError):
    """A command run as a job user failed; the message is its last line."""


#: Read as the run's user: root opening the journal (SQLite in WAL mode) could leave root-owned
#: -wal/-shm files in the run folder that the user's coordinator then cannot open.
_ACTIONS = """
import json, sys
from pathlib import Path
from runtime.control.journal.store import Journal
journal = Journal.in_run_dir(Path(sys.argv[1]))
print(json.dumps([(type(s.action).__name__, getattr(s.action, "job_id", None), s.status)
                  for s in journal.actions()]))
"""


def journal_actions_of(user: SiteUser, run_dir: Path) -> list[tuple[str, str, str]]:
    """(action type, job id, status) of every action in `user`'s run's journal, read as them
    through the site install."""
    r = user.run([str(user.python), "-c", _ACTIONS, str(run_dir)])
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
        raise UserCommandError(f"reading {run_dir}'s journal as {user.user}: {last[0]}")
    return [(kind, job, status) for kind, job, status in json.loads(r.stdout)]


def processes_of_run(markers: Sequence[str]) -> dict[int, tuple[int, str]]:
    """Every live process whose command line or environment mentions one of `markers` (a run's
    folder): pid -> (uid, command line). Found from /proc, independent of the code under test."""
    found: dict[int, tuple[int, str]] = {}
    wanted = [m.encode() for m in markers]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
            uid = proc.stat().st_uid
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(m in cmdline or m in environ for m in wanted):
            found[int(proc.name)] = (uid, cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found
