"""The control plane's event loop: uvloop when installed, the standard loop when asked or missing,
and a bad `FTHSDP_EVENT_LOOP` named rather than ignored."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.control.event_loop import (
    LOOP_ENV,
    chosen,
    loop_factory,
    loop_name,
    new_event_loop,
    run,
)
from slurm.errors import InputError

#: The tests that expect uvloop to run; the others hold with or without it.
needs_uvloop = pytest.mark.skipif(
    importlib.util.find_spec("uvloop") is None, reason="uvloop (the runtime extra) not installed"
)


@needs_uvloop
@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, "uvloop"), ("", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")],
)
def test_the_loop_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str | None, expected: str
) -> None:
    if value is None:
        monkeypatch.delenv(LOOP_ENV, raising=False)
    else:
        monkeypatch.setenv(LOOP_ENV, value)

    async def which() -> str:
        return loop_name(asyncio.get_running_loop())

    assert run(which()) == expected
    loop = new_event_loop()
    try:
        assert loop_name(loop) == expected
    finally:
        loop.close()


@pytest.mark.parametrize("value", ["uv", "UVLOOP", "trio", "asyncio "])
def test_an_unknown_loop_is_named(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(LOOP_ENV, value)
    with pytest.raises(InputError, match=LOOP_ENV) as caught:
        loop_factory()
    assert caught.value.value == value and "uvloop, asyncio" in caught.value.allowed


def test_without_uvloop_the_standard_loop_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LOOP_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    assert loop_factory() is asyncio.new_event_loop


def test_fthsdp_control_names_a_bad_loop_in_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fthsdp_cli.main import cli

    r = CliRunner().invoke(cli, ["control", str(tmp_path)], env={LOOP_ENV: "uv"})
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines() == [
        "Error: FTHSDP_EVENT_LOOP: got 'uv'; one of uvloop, asyncio"
    ], r.output


@needs_uvloop
@pytest.mark.parametrize(("value", "expected"), [("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_chosen_names_the_loop_run_starts(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    monkeypatch.setenv(LOOP_ENV, value)
    assert chosen() == expected


def test_the_startup_heap_is_frozen_and_later_garbage_still_collected() -> None:
    """In a process of its own (a frozen heap is for the rest of a process's life): what a
    server imported is frozen, a full collection then walks only what came after, and a cycle
    made after the freeze is still collected."""
    code = """
import gc, json
import runtime.control.http
from runtime.control.event_loop import freeze_startup_heap
frozen = freeze_startup_heap()
tracked = len(gc.get_objects())
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
del a, b
print(json.dumps({"frozen": frozen, "count": gc.get_freeze_count(), "tracked": tracked,
                  "collected": gc.collect()}))
"""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["frozen"] == seen["count"] > 10 * seen["tracked"], seen
    assert seen["collected"] >= 2, seen
