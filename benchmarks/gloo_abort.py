"""Can a survivor cut short a gloo allreduce that waits on a hung peer?

The healthy replicas' stall has a floor set by failure detection only if a collective that waits
on a dead or hung peer can be abandoned the moment the peer is known gone. Two process groups
from torchft, interleaved: `ProcessGroupGloo` (gloo in the worker's process, what fthsdp uses on
CPU) and `ProcessGroupBabyGloo` (gloo in a subprocess, which it kills on `shutdown()`; it has
no `abort()` of its own). In each repeat two ranks configure the group and complete one
allreduce; then rank 1 hangs (it neither joins the next allreduce nor closes its sockets, as a
frozen node) and rank 0 starts one and, 0.5 s later, calls `abort()` (in process) or
`shutdown()` (subprocess). Figures: when rank 0's allreduce raised (its timeout is 3 s), and what
`configure` cost (the subprocess's start and its torch import, for the baby group, paid at every
quorum change).

    python benchmarks/gloo_abort.py [--repeat N]
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Run, interleave, ratios, repeats_arg  # noqa: E402

TIMEOUT_S = 3.0
ABORT_AFTER_S = 0.5
#: Longest one repeat may take (both ranks), whatever the group does.
LIMIT_S = 60.0


def rank_main(kind: str, rank: int, port: int, out: Path) -> None:
    """One rank of a repeat; rank 0 writes its figures as JSON to `out`."""
    import threading
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torchft.process_group import ProcessGroupBabyGloo, ProcessGroupGloo

    store = None
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", port, None, True, wait_for_workers=False)
    pg = (ProcessGroupBabyGloo if kind == "baby" else ProcessGroupGloo)(
        timeout=timedelta(seconds=TIMEOUT_S)
    )
    t0 = time.monotonic()
    pg.configure(f"127.0.0.1:{port}/bench", f"r{rank}", rank, 2)
    t = torch.ones(4)
    pg.allreduce([t], dist.AllreduceOptions()).wait()
    configure_s = time.monotonic() - t0
    if rank == 1:
        time.sleep(LIMIT_S)  # hung: holds its sockets open, never joins
        os._exit(0)
    # torchft's baby group has no abort of its own: shutdown kills its subprocess
    threading.Timer(ABORT_AFTER_S, pg.shutdown if kind == "baby" else pg.abort).start()
    start = time.monotonic()
    try:
        pg.allreduce([t], dist.AllreduceOptions()).wait()
        raised = False
    except Exception:
        raised = True
    raised_s = time.monotonic() - start
    out.write_text(json.dumps({"configure_s": configure_s, "raised_s": raised_s, "raised": raised}))
    del store
    os._exit(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one(kind: str, work: Path) -> dict[str, Any]:
    port = free_port()
    out = work / f"{kind}-{port}.json"
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank-of", kind, str(r), str(port), str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # the baby group's subprocess goes with its rank's group
        )
        for r in (0, 1)
    ]
    try:
        procs[0].wait(timeout=LIMIT_S)
        return dict(json.loads(out.read_text()))
    except (subprocess.TimeoutExpired, OSError, ValueError):
        return {"configure_s": float("nan"), "raised_s": float("nan"), "raised": False}
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def main() -> int:
    repeats = repeats_arg()
    run = Run(
        "gloo_abort",
        "Aborting a gloo allreduce that waits on a hung peer",
        f"Two ranks on loopback, torch's gloo through torchft's process groups, allreduce "
        f"timeout {TIMEOUT_S:g} s. After one completed allreduce, rank 1 hangs (sockets open, "
        f"never joins) and rank 0 calls `abort()` ({ABORT_AFTER_S:g} s into the next one; "
        "`shutdown()` for the subprocess group, which has no abort of its own and kills its "
        "subprocess). "
        "In process: `ProcessGroupGloo`; subprocess: `ProcessGroupBabyGloo`. Interleaved.",
        repeats,
    )
    work = Path(tempfile.mkdtemp(prefix="fthsdp-gloo-abort-"))
    got = interleave(
        {"in process": lambda: one("gloo", work), "subprocess": lambda: one("baby", work)}, repeats
    )
    for name, rows in got.items():
        run.row(f"{name}: allreduce raised after", [r["raised_s"] for r in rows], "s", digits=2)
        run.row(f"{name}: configure + first allreduce", [r["configure_s"] for r in rows], "s")
        run.notes.append(
            f"- {name}: the allreduce raised in {sum(r['raised'] for r in rows)} of "
            f"{len(rows)} repeats."
        )
    raised = {name: [r["raised_s"] for r in rows] for name, rows in got.items()}
    run.row(
        "in process / subprocess, raised after",
        ratios(raised, "in process", "subprocess"),
        "x",
        digits=1,
    )
    run.write()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--rank-of":
        rank_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
    sys.exit(main())
