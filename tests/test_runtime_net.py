"""`runtime.net.free_port` draws ports below the ephemeral range, where no process's outgoing
connection takes them between the check and the caller's bind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from runtime import net


@pytest.mark.parametrize(
    ("text", "start"),
    [("32768\t60999\n", 32768), ("15000 60999", 15000), ("", 32768), ("x y", 32768)],
)
def test_the_ephemeral_start_is_read_from_the_kernel(tmp_path: Path, text: str, start: int) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    assert net._ephemeral_start(path) == start


def test_a_port_is_drawn_below_the_ephemeral_range_and_binds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(net, "_ephemeral_start", lambda: 32768)
    ports = {net.free_port() for _ in range(20)}
    assert all(net.LOW <= p < net.HIGH for p in ports)
    assert len(ports) > 1  # drawn at random: concurrent callers rarely meet
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_a_port_in_use_is_not_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setattr(net.random, "randrange", lambda _lo, _hi: taken)
        port = net.free_port()
    assert port != taken  # every draw was taken: the kernel's choice


def test_without_room_below_the_ephemeral_range_the_kernel_chooses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(net, "_ephemeral_start", lambda: net.LOW)
    port = net.free_port()
    assert not net.LOW <= port < net.HIGH  # nothing drawn: the kernel's (ephemeral) choice
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
