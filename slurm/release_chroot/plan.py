"""The pure parts of a run in a chroot: the Debian mirror, the venv's base, the mount plan, the
command's environment and working directory. Tested by tables; nothing here touches the host.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm.errors import EnvironmentProblem

SANE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def debian_mirror(sources: Mapping[str, str]) -> str:
    """The Debian archive URI the host's apt uses (not the security archive).

    `sources` maps a file name to its text: deb822 `.sources` files (`URIs:`) and one-line
    `.list` files (`deb URI SUITE ...`) are both read.
    """
    candidates: list[str] = []
    for name, text in sorted(sources.items()):
        if name.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(
                    (k.strip().lower(), v.strip())
                    for k, _, v in (
                        line.partition(":")
                        for line in stanza.splitlines()
                        if line.strip() and not line.lstrip().startswith("#")
                    )
                )
                enabled = fields.get("enabled", "yes").lower() != "no"
                if enabled and "deb" in fields.get("types", "").split():
                    candidates += fields.get("uris", "").split()
        else:
            for line in text.splitlines():
                parts = line.split("#", 1)[0].split()
                if parts[:1] == ["deb"]:
                    uri = next((p for p in parts[1:] if not p.startswith("[")), "")
                    candidates.append(uri)
    for uri in candidates:
        if uri.startswith(("http://", "https://", "file:/")) and "security" not in uri:
            return uri.rstrip("/")
    raise EnvironmentProblem(
        "no Debian archive URI in /etc/apt/sources.list{,.d/*} (needed to build a chroot)"
    )


def venv_base_prefix(venv: Path) -> Path:
    """The installation the venv's interpreter comes from (pyvenv.cfg `home`, resolved).

    It is bind-mounted into the chroot at the same path; an interpreter from the host's own /usr
    cannot be (it would shadow the chroot's system), which is refused with a reason.
    """
    cfg = venv / "pyvenv.cfg"
    try:
        text = cfg.read_text()
    except OSError as exc:
        raise EnvironmentProblem(f"{cfg}: cannot read ({exc.strerror}); is {venv} a venv?") from exc
    home = next(
        (
            v.strip()
            for k, _, v in (ln.partition("=") for ln in text.splitlines())
            if k.strip() == "home"
        ),
        None,
    )
    if not home:
        raise EnvironmentProblem(f"{cfg}: no 'home =' line")
    prefix = Path(home).resolve().parent
    if prefix in {Path("/"), Path("/usr"), Path("/usr/local"), Path("/bin")}:
        raise EnvironmentProblem(
            f"the venv {venv} is built on the system interpreter ({home}), which cannot be "
            "bind-mounted into a chroot; build it on a self-contained Python (pyenv, uv) instead"
        )
    return prefix


@dataclass(frozen=True)
class Mount:
    """One mount of a run, in the order made; `recursive` binds are then made slaves of the host."""

    kind: str  # "tmpfs" | "overlay" | "proc" | "bind"
    target: Path
    source: Path | None = None
    options: str = ""
    recursive: bool = False


def mount_plan(
    chroot: Path, scratch: Path, binds: Sequence[Path], overlay: bool = True
) -> tuple[Path, list[Mount]]:
    """The root the command will see and the mounts that build it, in order.

    `scratch` is an empty directory (private to the run's mount namespace) holding the overlay's
    writable layer. Without `overlay` (a build) the chroot itself is the root and nothing of the
    host but /proc, /dev and /sys is mounted into it.
    """
    mounts: list[Mount] = []
    if overlay:
        root = scratch / "root"
        mounts += [
            Mount("tmpfs", scratch, options="mode=0755"),
            Mount(
                "overlay",
                root,
                options=f"lowerdir={chroot},upperdir={scratch}/upper,workdir={scratch}/work",
            ),
        ]
    else:
        root = chroot
    mounts += [
        Mount("proc", root / "proc"),
        Mount("bind", root / "dev", Path("/dev"), recursive=True),
        Mount("bind", root / "sys", Path("/sys"), recursive=True),
    ]
    if overlay:
        mounts.append(Mount("tmpfs", root / "run", options="mode=0755"))
        seen: set[Path] = set()
        for path in binds:
            if path in seen or any(p in path.parents for p in seen):
                continue
            seen.add(path)
            mounts.append(Mount("bind", root / path.relative_to("/"), path, recursive=True))
    return root, mounts


#: Set inside a release chroot to its Slurm release: a test can tell it runs where the host's
#: other tools (a browser, say) are not.
CHROOT_RELEASE_ENV = "FTHSDP_CHROOT_RELEASE"


def chroot_env(environ: Mapping[str, str], venv: Path, version: str) -> dict[str, str]:
    """The command's environment: the caller's, with a PATH that exists inside the chroot,
    without pointers at the host's own Slurm cluster, and naming the release it runs."""
    env = {k: v for k, v in environ.items() if k not in {"SLURM_CONF", "PYTHONHOME"}}
    env["PATH"] = f"{venv / 'bin'}:{SANE_PATH}"
    env[CHROOT_RELEASE_ENV] = version
    return env


def run_cwd(cwd: Path, binds: Sequence[Path], default: Path) -> Path:
    """The caller's directory when the chroot sees it (it is under a bind), else `default`."""
    if any(cwd == b or b in cwd.parents for b in binds):
        return cwd
    return default
