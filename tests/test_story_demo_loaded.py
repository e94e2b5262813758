"""The demo's fault story on a loaded machine: exactly one requeue, and the control job ends.

`examples/demo.toml` (3 replicas, each with a CPU helper component) on the health-gated dev
cluster while two CPU burners (`while True: pass`), or as many of `make test`'s other lanes
(`tests/cpu_load.py`), compete for this machine's cores, as a user's other work would. An Xid 79
on replica 1's node is handled by requeueing replica 1 exactly once; the shared-CPU noise around
its replacement's start and catch-up does not evict a healthy replica as a straggler (eviction
holds off while a replica recovers, and a straggler must be slow against its own pace too). Once
every replica completed, the control job ends by itself (COMPLETED). The user's `fthsdp report`
of the run draws the three lanes with the Xid and its requeue on replica 1's, and names the job
and the node it left; it is opened in headless chromium where there is one (always under CI,
but in a release chroot, which has no browser).

The pure part of the demo's early stop (a control job that failed is one line naming its log)
is checked without Slurm.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from browser_harness import chromium_or_none, open_report
from control_harness import ROOT, clean_up, fthsdp, health_gated, requeues_in_journal, wait_until
from cpu_load import cpu_burners
from user_harness import SiteUser

from prolog_epilog import dev_health
from runtime.control.inject import inject
from slurm.backend import CommandBackend
from slurm.devcluster import DevClusterConfig


def _demo() -> Any:
    spec = importlib.util.spec_from_file_location("demo", ROOT / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("demo", module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_demo_stops_on_a_failed_control_job_with_one_line(tmp_path: Path) -> None:
    demo = _demo()
    log = demo.RUN_DIR / "logs" / "control-7.err"
    data = {"jobs": [{"role": "control", "job_id": "7", "state": "FAILED"}]}
    line = demo.control_failure(data)
    assert line.startswith("control job 7: FAILED; see ")
    assert str(log.relative_to(ROOT)) in line and "\n" not in line
    data["jobs"][0]["state"] = "RUNNING"
    assert demo.control_failure(data) is None
    log_file = tmp_path / "x.err"
    log_file.write_text("start\nfthsdp: torchft_lighthouse did not listen on http://h:1\n\n")
    assert demo.last_line(log_file) == "fthsdp: torchft_lighthouse did not listen on http://h:1"


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_demo_fault_story_on_a_loaded_machine(
    slurm_cluster: DevClusterConfig, site_user: SiteUser, tmp_path: Path
) -> None:
    with health_gated(slurm_cluster) as gated, cpu_burners(2):
        _story(gated, site_user, tmp_path)


def _evictions(env: SiteUser, run_dir: Path) -> int:
    events = fthsdp(env, "events", str(run_dir), "--json").splitlines()
    return sum(json.loads(line)["kind"] == "StragglerEviction" for line in events)


def _story(gated: DevClusterConfig, site_user: SiteUser, work: Path) -> None:
    # The shipped spec as the job user submits it from the checkout (its `[train] command` is
    # relative to there), with the run in the user's own folder.
    env = site_user.with_env(TINY_STEP_SLEEP_S="0.1")
    run_dir = site_user.home / "run"
    trace: list[tuple[float, dict[int, dict[str, Any]]]] = []
    victim: str | None = None
    sets = ["--set", f"job.run_dir={run_dir}", "--set", "job.name=demo-loaded"]
    try:
        r = env.fthsdp("submit", str(ROOT / "examples" / "demo.toml"), *sets, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-2000:]
        before = wait_until(
            env,
            run_dir,
            lambda r: all(x["state"] == "training" and (x["step"] or 0) >= 40 for x in r.values()),
            400,
            "all replicas training at step 40",
            trace,
        )
        jobs = {k: r["job_id"] for k, r in before.items()}
        victim = before[1]["nodes"][0]
        inject(dev_health.hardware_dir(gated), victim, "xid79", gated.gpus_per_node)
        final = wait_until(
            env,
            run_dir,
            lambda r: all(x["slurm_state"] == "COMPLETED" for x in r.values()),
            700,
            "the run to finish",
            trace,
        )
        assert requeues_in_journal(run_dir, env) == [(jobs[1], "done")]
        assert _evictions(env, run_dir) == 0
        assert final[0]["restarts"] == final[2]["restarts"] == 0
        assert final[1]["restarts"] == 1
        # The control job ends by itself once every replica completed (30 s grace).
        backend = CommandBackend()
        status = json.loads(fthsdp(env, "status", str(run_dir), "--json"))
        (control,) = [str(j["job_id"]) for j in status["jobs"] if j["role"] == "control"]
        deadline = time.monotonic() + 180
        state = ""
        while time.monotonic() < deadline:
            found = [i for i in backend.jobs([control]) if i.base_id == control]
            state = found[0].state if found else "GONE"
            if state in ("COMPLETED", "GONE"):
                break
            time.sleep(3)
        assert state == "COMPLETED", f"control job {control}: {state}"
        _report_shows_the_fault(env, run_dir, work, jobs[1], victim)
    finally:
        clean_up(env, run_dir, gated, victim)


def _report_shows_the_fault(
    env: SiteUser, run_dir: Path, work: Path, job_id: str, victim: str
) -> None:
    """`fthsdp report` of the finished run, made by its user: three lanes, the Xid on replica
    1's lane with its requeue, and the lane names its job and the node it left. Read in headless
    chromium (its console, its script, a screenshot) where there is one, and it must be there
    under CI but in a release chroot; the page's own markup is checked either way."""
    made = env.fthsdp("report", str(run_dir))
    assert made.returncode == 0, made.stderr[-2000:]
    page = run_dir / "report.html"
    assert made.stdout.split() == [str(page)]
    dom = page.read_text()
    if chromium_or_none() is not None:
        dom = open_report(page, work, replicas=(0, 1, 2), faulted=(1,))
    for replica in (0, 1, 2):
        assert f'id="lane-{replica}"' in dom
    assert '<g class="fault" data-replica="1">' in dom
    assert '<g class="action requeue" data-replica="1">' in dom
    lane = dom.split('id="lane-1"', 1)[1].split("</title>", 1)[0]
    assert job_id in lane and victim in lane, lane
    faults = dom.split('id="faults"', 1)[1].split("</table>", 1)[0]
    assert faults.count('class="fault-row" data-replica="1"') >= 1, faults
    assert "xid" in faults.lower(), faults


def test_demo_refuses_a_site_install_that_is_not_one(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--site", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 2, r
    assert r.stderr.count("\n") == 1 and "not a site install" in r.stderr, r.stderr
    assert str(tmp_path) in r.stderr and "Traceback" not in r.stderr
