"""What a durable checkpoint costs the step loop: DCP's blocking save against its asynchronous one.

One replica of 2 gloo ranks holds an FSDP-sharded MLP and its AdamW state (`--dim`, `--layers`).
The two kinds of save alternate, `--repeat` times each (default 5), into fresh folders:

- blocking (`dcp.save`): the step loop waits for the whole write;
- asynchronous (`dcp.async_save` on a gloo group of its own, as `runtime.checkpoint` does): the
  step loop waits for the copy into staging memory only; the write runs on a thread, and the
  loop keeps stepping meanwhile. Its steps are timed against steps with no write running (on
  this 2-core machine the writer thread competes with training for CPU).

Each ratio is taken within one repeat.

    python benchmarks/checkpoint.py [--repeat 5] [--dim 2048] [--layers 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.harness import MIN_REPEATS, Run  # noqa: E402

WORLD = 2
#: Steps timed with no write running, before each asynchronous save.
QUIET_STEPS = 5
#: A write running past this is a failure of the benchmark, not a figure.
WRITE_LIMIT_S = 300.0


def _worker(rank: int, out: str, repeats: int, dim: int, layers: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=WORLD
    )
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=WRITE_LIMIT_S))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(dim, dim) for _ in range(layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randn(32, dim)

    def step() -> float:
        start = time.perf_counter()
        loss = model(batch).square().mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
        return time.perf_counter() - start

    step()  # AdamW's state exists from here on
    base = Path(out)
    results: dict[str, list[float]] = {
        k: [] for k in ("blocking_s", "stage_s", "write_s", "quiet_step_s", "writing_step_s")
    }
    for i in range(repeats):
        for kind in ("blocking", "async") if i % 2 == 0 else ("async", "blocking"):
            path = base / f"{kind}_{i}"
            model_sd, optim_sd = get_state_dict(model, optim)
            state = {"model": model_sd, "optim": optim_sd}
            dist.barrier()
            if kind == "blocking":
                start = time.perf_counter()
                dcp.save(state, checkpoint_id=str(path))
                results["blocking_s"].append(time.perf_counter() - start)
            else:
                quiet = [step() for _ in range(QUIET_STEPS)]
                dist.barrier()
                start = time.perf_counter()
                future = dcp.async_save(state, checkpoint_id=str(path), process_group=group)
                results["stage_s"].append(time.perf_counter() - start)
                writing = []
                while not future.done():  # type: ignore[union-attr]
                    writing.append(step())
                future.result()  # type: ignore[union-attr]
                results["write_s"].append(time.perf_counter() - start)
                results["quiet_step_s"].append(statistics.median(quiet))
                results["writing_step_s"].append(
                    statistics.median(writing) if writing else float("nan")
                )
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
    size = sum(p.numel() * p.element_size() for p in model.parameters()) * 3  # + AdamW's two
    if rank == 0:
        (base / "results.json").write_text(json.dumps({**results, "state_bytes": size}))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=int(os.environ.get("BENCH_REPEATS", 5)))
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    if args.repeat < MIN_REPEATS:
        print(f"checkpoint: --repeat must be >= {MIN_REPEATS}", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    run = Run(
        "checkpoint",
        "Durable checkpoint: the step loop's stall",
        f"One replica of {WORLD} gloo ranks (CPU), an FSDP-sharded MLP of {args.layers} × "
        f"Linear({args.dim}, {args.dim}) with its AdamW state; blocking `dcp.save` and "
        "`dcp.async_save` (on a gloo group of its own, as `runtime.checkpoint`) alternate into "
        "fresh folders on the local disk. Stall: the time the step loop waits. Steps while "
        f"writing: the median training step while the asynchronous write runs, against the "
        f"median of {QUIET_STEPS} steps just before it. Each ratio is taken within one repeat.",
        args.repeat,
    )
    with tempfile.TemporaryDirectory(prefix="fthsdp-ckpt-bench-") as tmp:
        ctx = mp.start_processes(
            _worker,
            args=(tmp, args.repeat, args.dim, args.layers),
            nprocs=WORLD,
            start_method="spawn",
            join=False,
        )
        deadline = time.monotonic() + WRITE_LIMIT_S * 2 * args.repeat
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                print("checkpoint: the workers ran past their time limit", file=sys.stderr)
                return 3
        res: dict[str, Any] = json.loads((Path(tmp) / "results.json").read_text())
    ms = lambda key: [v * 1000 for v in res[key]]  # noqa: E731
    run.row("blocking save: stall", ms("blocking_s"), "ms")
    run.row("asynchronous save: stall (staging copy)", ms("stage_s"), "ms")
    run.row("asynchronous save: write done after", ms("write_s"), "ms")
    stall = [a / b for a, b in zip(res["stage_s"], res["blocking_s"], strict=True)]
    run.row("asynchronous stall / blocking stall", stall, "x", "< 1")
    run.row("step with no write running", ms("quiet_step_s"), "ms")
    slowed = [a / b for a, b in zip(res["writing_step_s"], res["quiet_step_s"], strict=True)]
    run.row("step while writing / step with no write", slowed, "x")
    run.extra["state_bytes"] = res["state_bytes"]
    run.extra["samples"] = {k: v for k, v in res.items() if k != "state_bytes"}
    mib = res["state_bytes"] / 2**20
    run.notes.append(
        f"- State per replica: {mib:.0f} MiB (parameters and AdamW's two moments), sharded "
        f"over {WORLD} ranks. CPU and local disk only; no GPU staging (pinned memory) measured."
    )
    med = statistics.median(stall)
    run.notes.append(
        f"- The asynchronous save stalls the step loop {med:.2f}× as long as the blocking one "
        "(median). The write itself still costs CPU: on this 2-core machine the steps taken "
        "while it runs are slower by the ratio above, a cost the blocking save pays as stall."
    )
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
