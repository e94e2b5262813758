"""A run's report opened in a real browser: Debian's headless `chromium` (`make browser-deps`).

Used by the local report test and by the demo's dev-cluster story, so that both read the page
the same way: the DOM after the page's script ran, the console, and a screenshot.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from slurm.release_chroot import CHROOT_RELEASE_ENV

BROWSER_S = 90


MISSING = "chromium is not installed (make browser-deps installs Debian's, as root)"


def chromium_or_none() -> str | None:
    """The browser's path, or None without one; under CI (`CI` set) a missing one fails.

    A release chroot carries no browser, and a report's page does not depend on the Slurm
    release: there the story checks the page's markup, and its run on the host's release reads
    the page in chromium."""
    found = shutil.which("chromium")
    if found is None and os.environ.get("CI") and not os.environ.get(CHROOT_RELEASE_ENV):
        pytest.fail(MISSING)
    return found


def chromium() -> str:
    """The browser's path; the test is skipped without one, and fails under CI."""
    found = chromium_or_none()
    if found is None:
        pytest.skip(MISSING)
    return found


def browser(
    browser_path: str, page: Path, profile: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    argv = [browser_path, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run"]
    argv += [f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(
        [*argv, page.as_uri()], capture_output=True, text=True, timeout=BROWSER_S, check=False
    )


def colours(png: Path) -> int:
    """How many colours an image has (a blank page has one or two)."""
    from PIL import Image

    with Image.open(png) as image:
        found = image.convert("RGB").getcolors(maxcolors=1 << 16)
    return len(found) if found is not None else 1 << 16


def open_report(page: Path, work: Path, replicas: Iterable[int], faulted: Iterable[int]) -> str:
    """Load `page` in headless chromium and check what every report must show; its DOM.

    Asserted: nothing on the console (an uncaught error is a console message too), the page's
    script ran (times are the viewer's, not UTC), a lane for each of `replicas` with a training
    segment somewhere, a fault marker on each lane of `faulted`, and a screenshot that is not
    one colour."""
    path = chromium()
    profile = work / "profile"
    dom = browser(path, page, profile, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    for replica in replicas:
        assert f'class="lane" id="lane-{replica}" data-replica="{replica}"' in dom.stdout
    for replica in faulted:
        assert f'<g class="fault" data-replica="{replica}">' in dom.stdout
    assert 'class="segment training"' in dom.stdout
    assert "UTC</span>" not in dom.stdout

    shot = work / "shot.png"
    taken = browser(path, page, profile, f"--screenshot={shot}", "--window-size=1200,1400")
    assert taken.returncode == 0 and shot.is_file(), taken.stderr[-2000:]
    assert colours(shot) > 8, "the screenshot is blank"
    return dom.stdout
