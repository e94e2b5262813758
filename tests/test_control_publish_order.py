"""The control plane publishes its incarnation before its coordinator answers.

A worker whose quorum failed tells a control plane restarted in place (its coordinator down,
`control.json` about to name a new incarnation) from a real failure (the coordinator named there
answers) by asking that coordinator (`runtime.worker.control_wait`). So a new coordinator must
not answer at an address while `control.json` still names the dead incarnation: its port is bound
(held, refusing connections) until the file is written, then it answers.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from control_harness import RecordingBackend, two_replica_config

from runtime.control import service
from runtime.control.http import RunningCoordinator, start_coordinator
from slurm.rundir import read_control


def _answers(address: str) -> bool:
    parsed = urlparse(address)
    assert parsed.hostname is not None and parsed.port is not None
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=1.0):
            return True
    except OSError:
        return False


def _held(port: int) -> bool:
    """Whether `port` is bound by someone: a plain bind (no SO_REUSEADDR) of it fails."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@pytest.mark.timeout(60)
def test_a_coordinator_started_unserved_holds_its_port_and_refuses_until_served(
    tmp_path: Path,
) -> None:
    async def story() -> tuple[bool, bool, bool]:
        running = await start_coordinator(
            two_replica_config(tmp_path), RecordingBackend(), serve=False
        )
        try:
            held = _held(urlparse(running.url).port or 0)
            before = await asyncio.to_thread(_answers, running.url)
            await running.serve()
            after = await asyncio.to_thread(_answers, running.url)
            return held, before, after
        finally:
            await running.close()

    held, before, after = asyncio.run(story())
    assert held, "the unserved coordinator's port was free for another to take"
    assert not before, "the coordinator answered before it was served"
    assert after, "the served coordinator did not answer"


@pytest.mark.timeout(60)
def test_control_json_names_the_incarnation_before_its_coordinator_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}
    real_write = service.write_control_file

    async def recorded_start(config: Any, backend: Any = None, serve: bool = True) -> Any:
        running: RunningCoordinator = await start_coordinator(config, RecordingBackend(), serve)
        seen["running"] = running
        return running

    def checked_write(run_dir: Path, info: dict[str, object]) -> None:
        seen["answered_before_the_write"] = _answers(str(info["coordinator"]))
        real_write(run_dir, info)

    async def story() -> bool:
        stop = asyncio.Event()
        task = asyncio.create_task(
            service.serve(two_replica_config(tmp_path), None, stop, finish_grace_s=None)
        )
        try:
            for _ in range(400):
                if (tmp_path / "control.json").exists() and "running" in seen:
                    url = seen["running"].url
                    if await asyncio.to_thread(_answers, url):
                        found = read_control(tmp_path)
                        return found is not None and found.coordinator == url
                await asyncio.sleep(0.05)
            raise AssertionError("the control plane never came up")
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)

    monkeypatch.setattr(service, "start_coordinator", recorded_start)
    monkeypatch.setattr(service, "write_control_file", checked_write)
    assert asyncio.run(story()), "control.json named another coordinator once this one answered"
    assert seen["answered_before_the_write"] is False
