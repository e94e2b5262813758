"""Model-quality benchmark: does FT-HSDP under faults train as well as static HSDP, on real data?

`examples/train_digits.py` (a small MLP on scikit-learn's digits, 1,400 training images, 397
held out) on 3 replicas x 1 rank, in five configurations, `--repeat` seeds each (the seed sets the
initial weights; the data order is the ledger's), interleaved:

1. `static`: static HSDP (`runtime.baselines` `plain`: `fully_shard` on a fixed 2-D mesh, no
   torchft), every replica in every step;
2. `ft`: FT-HSDP, no fault;
3. `kills3`: FT-HSDP with exactly 3 `kill -9`s of a replica at steps drawn from the seed;
4. `quarter_out`: FT-HSDP with replica 2 killed at 25 % of the steps and restarted only once the
   others reached 50 % (it rejoins after its restart: the outage is measured, not assumed);
5. `straggler`: FT-HSDP with replica 1 slowed 2x, detected and evicted (restarted).

Every `--eval-every` steps and at the end the trainers record the held-out loss and accuracy of
the current weights. Reported: those at 25/50/75/100 % of the steps per configuration (mean,
std, min-max over seeds), each faulted configuration's final figures minus static HSDP's of the
same seed, set against static HSDP's own seed-to-seed spread, and `docs/quality.png`. Then
why a faulted run differs (`explain`): its ledger's trained samples replayed in one process, with
and without the learning rate scaled to the replicas that took part, and static HSDP's spread
when only the data order moves.

    PYTHONPATH=$PWD python benchmarks/quality.py [--steps 300] [--repeat 5] [--configs ft,kills3]
    PYTHONPATH=$PWD python benchmarks/quality.py --rerender [--keep DIR]   # re-analyse the JSON
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.harness import FIGURES, Run, interleave, repeats_arg  # noqa: E402
from runtime.env import Timeouts  # noqa: E402
from runtime.local.config import LaunchConfig  # noqa: E402

EXAMPLE = ROOT / "examples" / "train_digits.py"
PNG = ROOT / "docs" / "quality.png"
REPLICAS = 3
CONFIGS = ("static", "ft", "kills3", "quarter_out", "straggler")
FAULTED = ("kills3", "quarter_out", "straggler")
LABELS = {
    "static": "static HSDP",
    "ft": "FT-HSDP, no fault",
    "kills3": "FT-HSDP, 3 kills",
    "quarter_out": "FT-HSDP, 1 replica out ≥ ¼ of the run",
    "straggler": "FT-HSDP, 1 straggler evicted",
}
FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def kill_schedule(seed: int, steps: int, kills: int = 3) -> tuple[tuple[int, int], ...]:
    """`kills` (replica, step) pairs from the seed: steps in [10 %, 70 %) of the run, at least a
    tenth of the run apart (a replica needs its restart time to come back), replicas at random."""
    rng = random.Random(seed)
    lo, hi, gap = steps // 10, int(steps * 0.7), steps // 10
    while True:
        at = sorted(rng.sample(range(lo, hi), kills))
        if all(b - a >= gap for a, b in itertools.pairwise(at)):
            return tuple((rng.randrange(REPLICAS), s) for s in at)


def heldout_curve(run_dir: Path, pattern: str) -> list[list[float]]:
    """[[step, seconds since step 0 began, loss, acc], ...] from the progress files' metrics
    events. Every replica holds the same weights at a step, so the earliest record of a step
    is kept (a redone step records the same weights again)."""
    by_step: dict[int, tuple[float, float, float]] = {}
    for path in sorted((run_dir / "progress").glob(pattern)):
        for line in path.read_text().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a torn last line of a killed writer
            m = ev.get("metrics") or {}
            if ev.get("event") != "metrics" or "heldout_loss" not in m:
                continue
            step = int(ev["step"])
            if step not in by_step or ev["t"] < by_step[step][0]:
                by_step[step] = (float(ev["t"]), float(m["heldout_loss"]), float(m["heldout_acc"]))
    if 0 not in by_step:
        return []
    t0 = by_step[0][0]
    return [[s, t - t0, loss, acc] for s, (t, loss, acc) in sorted(by_step.items())]


def participation(run_dir: Path, steps: int) -> float:
    """Replica-steps trained over replicas x steps, from the ledger (1.0: nobody ever missing)."""
    from runtime import ledger

    records = ledger.read_log(sorted((run_dir / "ledger").glob("r*.jsonl")))
    by_step = {r.step: len(r.contributors) for r in records}
    return sum(by_step.values()) / (REPLICAS * steps)


def contributors(run_dir: Path) -> str:
    """The slots that trained each committed step, from the ledger, as "012,02,..." (compact
    enough for the tracked JSON; `trained_units` turns it back into samples)."""
    from runtime import ledger

    records = ledger.read_log(sorted((run_dir / "ledger").glob("r*.jsonl")))
    by_step = {r.step: r.contributors for r in records}
    return ",".join("".join(str(c) for c in by_step[step]) for step in sorted(by_step))


def trained_units(steps: str, batch: int = 16) -> list[list[list[int]]]:
    """Per committed step, the [lo, hi) units its contributors trained: the ledger's own
    arithmetic replayed from a fresh start, so the contributors alone decide them."""
    from runtime import ledger

    state, out = ledger.LedgerState(), []
    for part in steps.split(","):
        done = [int(c) for c in part]
        units = ledger.issue(state, REPLICAS, batch)
        out.append([[units[c].lo, units[c].hi] for c in done])
        state = ledger.commit(state, done, REPLICAS, batch)
    return out


def static_units(steps: int, offset: int = 0, batch: int = 16) -> list[list[list[int]]]:
    """Static HSDP's units (every replica, every step), the stream starting at `offset`."""
    return [
        [
            [offset + (t * REPLICAS + r) * batch, offset + (t * REPLICAS + r + 1) * batch]
            for r in range(REPLICAS)
        ]
        for t in range(steps)
    ]


def replay(seed: int, units: Sequence[Sequence[Sequence[int]]], scale_lr: bool = False) -> float:
    """The final held-out loss of one process trained on `units` (per step, the samples of the
    replicas that took part): the same update as the replicas' allreduce, which averages the
    participants' equal-sized unit means, formed in the same order. `scale_lr` scales the step's
    learning rate by the share of replicas that took part (the linear scaling rule for a smaller
    batch)."""
    import os
    import runpy

    import torch

    old = os.environ.get("DIGITS_SEED")
    os.environ["DIGITS_SEED"] = str(seed)
    try:
        ex = runpy.run_path(str(EXAMPLE), run_name="fthsdp_quality_replay")
    finally:
        if old is None:
            os.environ.pop("DIGITS_SEED", None)
        else:
            os.environ["DIGITS_SEED"] = old
    model = ex["make_model"]()
    opt = ex["make_optimizer"](model.parameters())
    data = ex["make_dataset"]()
    n, lr = len(data), float(ex["LR"])
    params = list(model.parameters())
    for step in units:
        if scale_lr:
            for group in opt.param_groups:
                group["lr"] = lr * len(step) / REPLICAS
        # Each unit's mean gradient apart, then their sum over the participants, as the
        # replicas' allreduce forms it: one loss over all of the step's samples is the same
        # update in exact arithmetic, but its other rounding grew to 1e-4 in the held-out loss
        # within 10 steps of a run that trains near the edge of stability.
        total: list[torch.Tensor] | None = None
        for lo, hi in step:
            ids = torch.tensor([i % n for i in range(lo, hi)])
            opt.zero_grad()
            ex["loss_fn"](model(data.x[ids]), data.y[ids]).backward()
            grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]
            total = grads if total is None else [a + b for a, b in zip(total, grads, strict=True)]
        if total is None:
            continue
        for p, g in zip(params, total, strict=True):
            p.grad = g / len(step)
        opt.step()
    return float(ex["evaluate"](model)["heldout_loss"])


def explain(runs: dict[str, list[dict[str, Any]]], steps: int) -> dict[str, Any]:
    """Why a faulted run's final loss differs from static HSDP's, in one process per replay:

    * `replayed`: the faulted run's own committed units replayed; equal to the run's loss when
      the difference comes from the data and batch sizes alone, not from the fault tolerance
      (a stale heal or a lost update would show here);
    * `lr_scaled`: the same units with each step's learning rate scaled by its participants;
    * `order_std`: static HSDP's final-loss std when only the data order moves (the stream
      starting a fifth of an epoch further, four shifts per seed, paired with the seed's
      unshifted run): the yardstick for a run whose re-issued units change the order.
    """
    out: dict[str, Any] = {}
    seeds = [int(r["seed"]) for r in runs.get("static", [])]
    order = []
    for seed in seeds:
        base = replay(seed, static_units(steps))
        order += [replay(seed, static_units(steps, k * 280)) - base for k in (1, 2, 3, 4)]
    out["order_std"] = statistics.stdev(order) if len(order) > 1 else float("nan")
    out["order_range"] = [min(order), max(order)] if order else []
    for name in FAULTED:
        rows = []
        for r in runs.get(name, []):
            if not r.get("contributors"):
                continue
            units = trained_units(r["contributors"])
            rows.append(
                {
                    "seed": r["seed"],
                    "run": at_step(r["curve"], steps, 2),
                    "replayed": replay(int(r["seed"]), units),
                    "lr_scaled": replay(int(r["seed"]), units, scale_lr=True),
                }
            )
        if rows:
            out[name] = rows
    return out


def env_for(seed: int, args: argparse.Namespace) -> dict[str, str]:
    return {
        "PYTHONPATH": str(ROOT),
        "DIGITS_SEED": str(seed),
        "DIGITS_EVAL_EVERY": str(args.eval_every),
        "DIGITS_STEP_SLEEP_S": str(args.sleep),
    }


def run_static(seed: int, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    from runtime import baselines

    env = {**env_for(seed, args), baselines.EXAMPLE_ENV: str(EXAMPLE)}
    ok, error = True, None
    try:
        baselines.spawn("plain", run_dir, REPLICAS, args.ranks, args.steps, extra_env=env)
    except (RuntimeError, OSError) as exc:
        ok, error = False, str(exc)
    return {
        "ok": ok,
        "error": error,
        "weights_agree": None,
        "ledger_ok": None,
        "curve": heldout_curve(run_dir, "plain.jsonl"),
        "faults": [],
        "participation": 1.0,
    }


def launch_config(
    config: str, seed: int, args: argparse.Namespace, run_dir: Path, steps: int | None = None
) -> LaunchConfig:
    """The local launch of one FT-HSDP configuration (the short test runs these too)."""
    n = steps if steps is not None else args.steps
    cfg = LaunchConfig(
        run_dir=run_dir,
        command=[sys.executable, str(EXAMPLE)],
        replicas=REPLICAS,
        ranks_per_replica=args.ranks,
        steps=n,
        min_replicas=1,
        timeouts=Timeouts(heartbeat_s=2.0, allreduce_s=10.0, quorum_s=20.0, join_s=30.0),
        extra_env=env_for(seed, args),
        seed=seed,
        run_timeout_s=300.0,
        straggler_window_steps=args.window,
    )
    if config == "kills3":
        cfg.kill_schedule = kill_schedule(seed, n)
    elif config == "quarter_out":
        cfg.kill_replica, cfg.kill_at_step = 2, n // 4
        cfg.restart_after_steps = n // 4
    elif config == "straggler":
        cfg.slow_replica, cfg.slow_factor = 1, 2.0
    return cfg


def run_ft(config: str, seed: int, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    from runtime.local.launcher import LocalLauncher

    cfg = launch_config(config, seed, args, run_dir)
    summary = LocalLauncher(cfg).run()
    curve = heldout_curve(run_dir, "r*.jsonl")
    t0 = _step0_time(run_dir)
    faults = [
        {
            "kind": f["kind"],
            "replica": f["replica"],
            "step": f["step"],
            "t_kill": f["t_kill"] - t0,
            "t_rejoin": (f["t_rejoin"] - t0) if f["t_rejoin"] else None,
        }
        for f in summary.failures
    ]
    return {
        "ok": summary.ok,
        "error": summary.error,
        "weights_agree": summary.weights_agree,
        "ledger_ok": summary.ledger_ok,
        "curve": curve,
        "faults": faults,
        "participation": participation(run_dir, cfg.steps),
        "kill_schedule": [list(k) for k in cfg.kill_schedule],
        "contributors": contributors(run_dir),
    }


def _step0_time(run_dir: Path) -> float:
    ts = []
    for path in (run_dir / "progress").glob("r*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "metrics" and ev.get("step") == 0:
                ts.append(float(ev["t"]))
    return min(ts) if ts else 0.0


def at_step(curve: Sequence[Sequence[float]], step: int, col: int) -> float:
    """The curve's column at exactly `step` (NaN if that step was never evaluated)."""
    for point in curve:
        if int(point[0]) == step:
            return float(point[col])
    return float("nan")


def spread(values: Sequence[float]) -> dict[str, float]:
    vals = [v for v in values if v == v]
    if not vals:
        return {"mean": float("nan"), "std": float("nan"), "min": float("nan"), "max": float("nan")}
    return {
        "mean": statistics.fmean(vals),
        "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
        "min": min(vals),
        "max": max(vals),
    }


def analyse(runs: dict[str, list[dict[str, Any]]], steps: int) -> dict[str, Any]:
    """Per configuration: loss/acc spread at each fraction of the run; per faulted one: the
    paired (same seed) final difference from static HSDP against static HSDP's own spread."""
    marks = [round(steps * f) for f in FRACTIONS]
    table: dict[str, Any] = {}
    for name, rs in runs.items():
        table[name] = {
            str(m): {
                "loss": spread([at_step(r["curve"], m, 2) for r in rs]),
                "acc": spread([at_step(r["curve"], m, 3) for r in rs]),
            }
            for m in marks
        }
    diffs: dict[str, Any] = {}
    if "static" in runs:
        base = runs["static"]
        ref_loss = table["static"][str(steps)]["loss"]
        ref_acc = table["static"][str(steps)]["acc"]
        for name, rs in runs.items():
            if name == "static":
                continue
            pairs = list(zip(rs, base, strict=True))  # the same seed on both sides
            dl = [at_step(r["curve"], steps, 2) - at_step(b["curve"], steps, 2) for r, b in pairs]
            da = [at_step(r["curve"], steps, 3) - at_step(b["curve"], steps, 3) for r, b in pairs]
            loss_d, acc_d = spread(dl), spread(da)
            diffs[name] = {
                "loss": loss_d,
                "acc": acc_d,
                "loss_values": dl,
                "acc_values": da,
                # inside: the mean difference is no larger than one seed-to-seed std of static
                "loss_inside": abs(loss_d["mean"]) <= ref_loss["std"],
                "acc_inside": abs(acc_d["mean"]) <= ref_acc["std"],
            }
    return {"marks": marks, "table": table, "diffs": diffs}


def _fmt(s: dict[str, float], scale: float = 1.0, digits: int = 3) -> str:
    return (
        f"{s['mean'] * scale:.{digits}f} ± {s['std'] * scale:.{digits}f} "
        f"[{s['min'] * scale:.{digits}f} – {s['max'] * scale:.{digits}f}]"
    )


def notes(result: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The markdown tables of the docs section (mean ± std [min – max] over seeds)."""
    marks, table, diffs = result["marks"], result["table"], result["diffs"]
    out = [
        "Held-out loss (cross-entropy) at each share of the steps, mean ± std [min – max] over "
        "seeds:",
        "",
        "| configuration | " + " | ".join(f"step {m}" for m in marks) + " |",
        "|---|" + "---|" * len(marks),
    ]
    for name in runs:
        cells = [_fmt(table[name][str(m)]["loss"]) for m in marks]
        out.append(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Held-out accuracy (%), the same way:",
        "",
        "| configuration | " + " | ".join(f"step {m}" for m in marks) + " |",
        "|---|" + "---|" * len(marks),
    ]
    for name in runs:
        cells = [_fmt(table[name][str(m)]["acc"], 100.0, 1) for m in marks]
        out.append(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    if diffs:
        final = str(marks[-1])
        ref_l, ref_a = table["static"][final]["loss"], table["static"][final]["acc"]
        out += [
            "",
            f"Final figures minus static HSDP's of the same seed (mean ± std [min – max]), "
            f"against static HSDP's seed-to-seed spread: loss std {ref_l['std']:.4f}, range "
            f"{ref_l['max'] - ref_l['min']:.4f}; accuracy std {ref_a['std'] * 100:.2f} pp, range "
            f"{(ref_a['max'] - ref_a['min']) * 100:.2f} pp. *Inside* means the mean difference "
            "is at most one static std. Participation: replica-steps trained over 3 × steps "
            "(the ledger's contributors).",
            "",
            "| configuration | Δ loss | Δ accuracy (pp) | loss verdict | accuracy verdict "
            "| participation | faults per run |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, d in diffs.items():
            part = statistics.fmean(r["participation"] for r in runs[name])
            nf = [len(r["faults"]) for r in runs[name]]
            out.append(
                f"| {LABELS[name]} | {_fmt(d['loss'], 1.0, 4)} | {_fmt(d['acc'], 100.0, 2)} | "
                f"{'inside' if d['loss_inside'] else 'outside'} | "
                f"{'inside' if d['acc_inside'] else 'outside'} | {part:.3f} | {nf} |"
            )
    why = result.get("why") or {}
    if why and not math.isnan(why["order_std"]):
        lo, hi = why["order_range"]
        out += [
            "",
            "Why a faulted run differs: each run's committed units (from its ledger) replayed in "
            "one process reproduce its final loss (the *replayed − run* column: the fault "
            "tolerance itself adds nothing; the difference is which samples each step trained "
            "and how many), and the same replay with each step's learning rate scaled by the "
            "share of replicas that took part (*lr scaled − static*). The yardstick for a "
            "changed data order: static HSDP with only the order moved (the stream starting "
            f"280, 560, 840 or 1,120 samples on, paired with the seed's own run) has a final-loss "
            f"std of {why['order_std']:.4f}, range {lo:+.4f} – {hi:+.4f}.",
            "",
            "| configuration | Δ loss vs static | max abs(replayed − run) | Δ lr scaled vs static "
            "| inside the order spread |",
            "|---|---|---|---|---|",
        ]
        static = {int(r["seed"]): at_step(r["curve"], marks[-1], 2) for r in runs["static"]}
        for name in FAULTED:
            rows = why.get(name)
            if not rows:
                continue
            d = [r["run"] - static[int(r["seed"])] for r in rows]
            rep = max(abs(r["replayed"] - r["run"]) for r in rows)
            scaled = [r["lr_scaled"] - static[int(r["seed"])] for r in rows]
            inside = abs(statistics.fmean(d)) <= why["order_std"]
            out.append(
                f"| {LABELS[name]} | {_fmt(spread(d), 1.0, 4)} | {rep:.1e} | "
                f"{_fmt(spread(scaled), 1.0, 4)} | {'yes' if inside else 'no'} |"
            )
    clean = {
        name: all(r["ok"] and r["weights_agree"] and r["ledger_ok"] for r in rs)
        for name, rs in runs.items()
        if name != "static"
    }
    out += [
        "",
        "- Every FT-HSDP run ended with the replicas' final weights agreeing and the ledger "
        "clean: "
        + ", ".join(f"{LABELS[n]} {'yes' if ok else 'NO'}" for n, ok in clean.items())
        + ".",
    ]
    return out


def plot(runs: dict[str, list[dict[str, Any]]], path: Path, title: str) -> None:
    """Held-out loss against steps and against wall time (mean over seeds), the configured
    faults marked: x at a kill or eviction (on the mean curve at that step or second), o at a
    rejoin. A crash (a worker that failed by itself) is in the JSON and the notes, not here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax_s, ax_t) = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    for i, (name, rs) in enumerate(runs.items()):
        color = f"C{i}"
        steps = sorted({int(p[0]) for r in rs for p in r["curve"]})
        loss = np.array([np.nanmean([at_step(r["curve"], s, 2) for r in rs]) for s in steps])
        secs = np.array([np.nanmean([at_step(r["curve"], s, 1) for r in rs]) for s in steps])
        ax_s.plot(steps, loss, color=color, label=LABELS[name], lw=1.4)
        ax_t.plot(secs, loss, color=color, label=LABELS[name], lw=1.4)
        for r in rs:
            for f in r["faults"]:
                if f["kind"] not in ("injected", "straggler"):
                    continue
                ax_s.plot(f["step"], np.interp(f["step"], steps, loss), "x", color=color, ms=6)
                ax_t.plot(f["t_kill"], np.interp(f["t_kill"], secs, loss), "x", color=color, ms=6)
                if f["t_rejoin"] is not None:
                    y = np.interp(f["t_rejoin"], secs, loss)
                    ax_t.plot(f["t_rejoin"], y, "o", mfc="none", color=color, ms=5)
    ax_s.set_xlabel("step")
    ax_t.set_xlabel("seconds since step 0 began")
    ax_s.set_ylabel("held-out cross-entropy (mean over seeds)")
    for ax in (ax_s, ax_t):
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    ax_s.legend(fontsize=8)
    ax_t.plot([], [], "x", color="k", label="kill / eviction")
    ax_t.plot([], [], "o", mfc="none", color="k", label="rejoin")
    ax_t.legend(fontsize=8, loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=15)
    ap.add_argument("--sleep", type=float, default=0.05, help="stand-in compute per step, s")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--window", type=int, default=20, help="straggler window, steps")
    ap.add_argument("--repeat", type=int, default=repeats_arg(), help="seeds per configuration")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--png", type=Path, default=PNG)
    ap.add_argument("--keep", type=Path, default=None, help="Keep the run dirs under this folder.")
    ap.add_argument(
        "--rerender", action="store_true", help="re-analyse the stored runs; run nothing"
    )
    args = ap.parse_args()
    if args.rerender:
        rerender(args.png, args.keep)
        return
    names = [c for c in args.configs.split(",") if c]
    if unknown := set(names) - set(CONFIGS):
        raise SystemExit(f"quality: unknown configurations {sorted(unknown)}; from {CONFIGS}")
    if any(args.steps * f % args.eval_every for f in FRACTIONS):
        raise SystemExit("quality: --eval-every must divide 25/50/75/100 % of --steps")
    bench = Run(
        "quality",
        "Model quality under faults (digits, held out)",
        f"Local launcher, {REPLICAS} replicas × {args.ranks} rank of `examples/train_digits.py` "
        f"(an MLP 64-64-10 on scikit-learn's digits: 1,400 training images, 397 held out; "
        f"AdamW lr 1e-2, 16 samples per rank per step, {args.sleep} s of stand-in compute per "
        f"step), {args.steps} steps, held-out loss and accuracy every {args.eval_every} steps; "
        f"{args.repeat} seeds (initial weights) per configuration, interleaved: static HSDP "
        "(`runtime.baselines` plain), FT-HSDP without faults, with 3 kills at seeded steps, with "
        f"replica 2 killed at step {args.steps // 4} and restarted once the others reached step "
        f"{args.steps // 2}, and with replica 1 slowed 2× from step 20 (straggler window "
        f"{args.window} steps, evicted = restarted).",
        args.repeat,
    )
    with tempfile.TemporaryDirectory(prefix="fthsdp-quality-") as tmp:
        base = args.keep or Path(tmp)
        seeds = dict.fromkeys(names, 0)

        def job(name: str) -> Callable[[], dict[str, Any]]:
            def go() -> dict[str, Any]:
                seed = seeds[name]
                seeds[name] += 1
                run_dir = base / f"{name}_s{seed}"
                if name == "static":
                    out = run_static(seed, args, run_dir)
                else:
                    out = run_ft(name, seed, args, run_dir)
                return {"config": name, "seed": seed, **out}

            return go

        got = interleave({n: job(n) for n in names}, args.repeat)
    summarise(bench, got, args.steps, args.png)
    bench.write()


def summarise(
    bench: Run, got: dict[str, list[dict[str, Any]]], steps: int, png: Path
) -> dict[str, Any]:
    """The table's rows, the notes' tables, the raw runs and the PNG, from the runs."""
    result = analyse(got, steps)
    result["why"] = explain(got, steps) if "static" in got else {}
    static_std = result["table"]["static"][str(steps)]["loss"]["std"] if "static" in got else 0.0
    for name, rs in got.items():
        values = [at_step(r["curve"], steps, 2) for r in rs]
        bench.row(f"final held-out loss, {LABELS[name]}", values, "", digits=4)
    for name, rs in got.items():
        values = [100 * at_step(r["curve"], steps, 3) for r in rs]
        bench.row(f"final held-out accuracy, {LABELS[name]}", values, "%")
    for name, d in result["diffs"].items():
        bench.row(
            f"Δ final loss vs static HSDP (same seed), {LABELS[name]}",
            d["loss_values"],
            "",
            f"abs(mean) ≤ static std {static_std:.4f}",
            digits=4,
        )
    for name, rs in got.items():
        bench.row(
            f"wall time of the {steps} steps, {LABELS[name]}",
            [r["curve"][-1][1] if r["curve"] else float("nan") for r in rs],
            "s",
            digits=1,
        )
    bench.notes += notes(result, got)
    bench.notes.append("- The figure: ![held-out loss against steps and wall time](quality.png)")
    bench.extra["analysis"] = result
    bench.extra["runs"] = [r for rs in got.values() for r in rs]
    seeds = len(next(iter(got.values())))
    plot(got, png, f"{steps} steps, {seeds} seeds per configuration")
    return result


def rerender(png: Path, keep: Path | None) -> None:
    """Re-analyse the runs stored in the tracked JSON (tables, rows, PNG); the runs, the setup
    and the provenance stay those of the measurement. With the run folders kept (`--keep`), a
    run stored without its contributors gets them from its ledger."""
    path = FIGURES / "quality.json"
    data = json.loads(path.read_text())
    got: dict[str, list[dict[str, Any]]] = {}
    for r in data["runs"]:
        run_dir = keep / f"{r['config']}_s{r['seed']}" if keep is not None else None
        if r["config"] != "static" and "contributors" not in r and run_dir and run_dir.exists():
            r["contributors"] = contributors(run_dir)
        got.setdefault(r["config"], []).append(r)
    got = {name: got[name] for name in CONFIGS if name in got}
    bench = Run("quality", data["title"], data["setup"], data["repeats"])
    summarise(bench, got, int(data["analysis"]["marks"][-1]), png)
    bench.write()
    for folder in (FIGURES, FIGURES.parent / "results"):
        fresh = json.loads((folder / "quality.json").read_text())
        fresh["provenance"] = data["provenance"]
        (folder / "quality.json").write_text(json.dumps(fresh, indent=2) + "\n")


if __name__ == "__main__":
    main()
