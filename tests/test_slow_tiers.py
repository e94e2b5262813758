"""`make test`'s side-by-side driver: lanes run at once, parts of a lane in order, every rc
counts, a part's log reaches the terminal, and a stop reaches every running part's group."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from slow_tiers import Part, run


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _stamp(path: Path, rc: int = 0, wait_for: Path | None = None) -> list[str]:
    """A part that records when it started and, if told, waits for another part's stamp."""
    waits = f"\nwhile not os.path.exists({str(wait_for)!r}): time.sleep(0.02)" if wait_for else ""
    return _py(
        f"import os, sys, time\nopen({str(path)!r}, 'w').write(str(time.monotonic()))"
        f"{waits}\nprint('hello from', {path.name!r})\nsys.exit({rc})"
    )


def test_lanes_run_beside_each_other_and_parts_of_a_lane_in_order(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    # `a` waits for `b`: it ends only if the second lane started while the first still ran.
    host = Part("host", _stamp(a, wait_for=b))
    matrix = [
        Part("m1", _stamp(b), log=tmp_path / "logs" / "m.log"),
        Part("m2", _stamp(c, wait_for=b), log=tmp_path / "logs" / "m.log"),
    ]
    assert run([[host], matrix]) == 0
    assert float(c.read_text()) >= float(b.read_text())
    out = capfd.readouterr().out
    assert "hello from b" in out and "hello from c" in out
    assert "== m1: rc 0" in out and "== host: rc 0" in out
    assert not (tmp_path / "logs" / "m.log").exists()


def test_any_failing_part_fails_the_run_and_the_rest_still_run(tmp_path: Path) -> None:
    host = Part("host", _stamp(tmp_path / "a", rc=1))
    matrix = [Part("m1", _stamp(tmp_path / "b", rc=3)), Part("m2", _stamp(tmp_path / "c"))]
    assert run([[host], matrix]) == 1
    assert (host.rc, matrix[0].rc, matrix[1].rc) == (1, 3, 0)


def test_serial_runs_one_after_the_other(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    parts = [Part("host", _stamp(a)), Part("m1", _stamp(b))]
    assert run([parts]) == 0
    assert float(b.read_text()) >= float(a.read_text())


def test_a_stop_sends_sigint_to_every_running_part_and_runs_no_more(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    # Each part waits for SIGINT (not ignored: Python installed its handler) and records it.
    waiter = _py(
        "import signal, sys, time\n"
        "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
        "signal.signal(signal.SIGINT, lambda *a: (open("
        f"{str(seen)!r}, 'a').write('x'), sys.exit(5)))\n"
        f"open({str(tmp_path)!r} + '/up-' + sys.argv[1], 'w')\n"
        "time.sleep(60)"
    )
    host = Part("host", [*waiter, "h"])
    matrix = [Part("m1", [*waiter, "m"]), Part("m2", _stamp(tmp_path / "never"))]

    def interrupt() -> None:
        deadline = time.monotonic() + 30
        while not ((tmp_path / "up-h").exists() and (tmp_path / "up-m").exists()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=interrupt)
    t.start()
    try:
        assert run([[host], matrix]) == 130
    finally:
        t.join()
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
    assert seen.read_text() == "xx"
    assert (host.rc, matrix[0].rc, matrix[1].rc) == (5, 5, None)
    assert not (tmp_path / "never").exists()


def test_the_host_tier_runs_beside_the_releases_one_after_the_other(tmp_path: Path) -> None:
    from slow_tiers import BESIDE_THE_RELEASES, lanes

    matrix = [Part(f"m{v}", ["true"], log=tmp_path / f"slurm-{v}.log") for v in ("24.11", "26.05")]
    plan = lanes("py", matrix, tmp_path, serial=False)
    assert [len(lane) for lane in plan] == [1, 3]
    assert plan[0][0].log is None and plan[0][0].argv[-1] == "slurm or slow"
    assert plan[1][:2] == matrix
    # the multi-process tests without Slurm run after the releases, and not on the host lane
    moved = plan[1][2]
    assert moved.argv[-2:] == ["-m", "slow"] and moved.log is not None
    for path in BESIDE_THE_RELEASES:
        assert path in moved.argv and f"--ignore={path}" in plan[0][0].argv
        assert (Path(__file__).parent.parent / path).is_file()
    assert all(part.env["FTHSDP_TEST_LANES"] == "2" for lane in plan for part in lane)
    assert {part.env["FTHSDP_HEAVY_SLOTS"] for lane in plan for part in lane} == {
        str(os.cpu_count() or 2)
    }


def test_serial_runs_the_host_tier_as_one_part_then_each_release() -> None:
    from slow_tiers import lanes

    matrix = [Part("m", ["true"])]
    (lane,) = lanes("py", matrix, Path("/tmp"), serial=True)
    assert [p.name for p in lane][1:] == ["m", "multi-process tests without Slurm"]
    assert lane[0].argv[-2:] == ["-m", "slurm or slow"]
    assert lane[0].env["FTHSDP_TEST_LANES"] == "1"
    assert lane[0].env["FTHSDP_HEAVY_SLOTS"] == "0"


@pytest.mark.parametrize(
    ("count", "lanes", "started"), [(2, 1, 2), (2, 2, 1), (2, 4, 1), (1, 4, 0), (0, 1, 0)]
)
def test_other_lanes_stand_for_burners(count: int, lanes: int, started: int) -> None:
    from cpu_load import burners_needed

    assert burners_needed(count, lanes) == started


def test_a_part_runs_with_its_own_environment(tmp_path: Path) -> None:
    out = tmp_path / "env"
    part = Part("p", _py(f"import os; open({str(out)!r}, 'w').write(os.environ['FTHSDP_X'])"))
    part.env["FTHSDP_X"] = "7"
    assert run([[part]]) == 0
    assert out.read_text() == "7"


def test_heavy_tests_take_turns_for_the_machines_slots(tmp_path: Path) -> None:
    from machine_slots import slot

    held: list[int | None] = []
    order: list[str] = []
    with slot(2, tmp_path) as a, slot(2, tmp_path) as b:
        held += [a, b]
        done = threading.Event()

        def third() -> None:
            with slot(2, tmp_path, poll_s=0.01) as c:
                order.append(f"third got {c}")
            done.set()

        t = threading.Thread(target=third)
        t.start()
        assert not done.wait(0.3), "a third holder got in while both slots were taken"
        order.append("first two leave")
    assert done.wait(10)
    t.join()
    assert held == [0, 1]
    assert order[0] == "first two leave" and order[1].startswith("third got ")


def test_no_limit_means_no_wait(tmp_path: Path) -> None:
    from machine_slots import slot

    with slot(0, tmp_path) as a, slot(0, tmp_path) as b:
        assert (a, b) == (None, None)
    assert not list(tmp_path.iterdir())
