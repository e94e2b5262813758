#!/usr/bin/env bash
# One-shot capture on a machine with NVIDIA GPUs, for fixtures and for checking the health checks
# against real hardware. Read-only: it never resets a GPU, clears the kernel ring buffer or writes
# outside $OUT. Every command runs under `timeout`; a command that fails leaves its stderr and exit
# code beside its output and the script carries on.
#
#   OUT=/tmp/capture benchmarks/gpu_capture.sh          # run from the repository root
#
# The records, check and timing parts import the package: FTHSDP_PYTHON names a Python 3.11+
# that has its dependencies and nvidia-ml-py (a small venv made with `pip install -e .
# nvidia-ml-py` is enough: prolog_epilog never imports torch). Without one those parts record
# the import error and the nvidia-smi and kernel-log captures are still complete.
#
# What lands in $OUT:
#   smi/      nvidia-smi -q, -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER, nvlink -s, nvlink -e, and the
#             exact --query-gpu / --query-compute-apps CSVs the checks ask for (fields read from
#             prolog_epilog/smi_parsers.py, so they cannot drift from what the checks run)
#   klog/     dmesg raw, -r, -T, --time-format=iso, -x, -x --time-format=iso; journalctl -k in
#             short, short-precise, short-iso, short-iso-precise, short-monotonic; /proc/stat btime
#   records/  every record the NVML source and the nvidia-smi source produce, as JSON, and a diff
#   check/    `fthsdp check --json` with --gpu-source nvml and nvidia-smi, and their diff
#   timing/   wall time of the default suite and of every check, 3 runs each, both sources
#   env.txt   host, kernel, driver, util-linux, systemd, python versions; SUMMARY.txt at the end
set -u
OUT="${OUT:?set OUT to the folder that receives the capture}"
PY="${FTHSDP_PYTHON:-python3}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
T=60 # seconds per command unless the call sets T
mkdir -p "$OUT"/{smi,klog,records,check,timing}
cd "$REPO" || exit 1

# cap NAME CMD...: stdout to $OUT/NAME, stderr to NAME.err, exit code to NAME.rc
cap() {
	local name="$1"
	shift
	timeout --kill-after=5 "$T" "$@" >"$OUT/$name" 2>"$OUT/$name.err"
	echo $? >"$OUT/$name.rc"
	[ -s "$OUT/$name.err" ] || rm -f "$OUT/$name.err"
}

{
	echo "date: $(date -u +%FT%TZ)"
	echo "host: $(hostname)"
	echo "kernel: $(uname -r)"
	echo "driver: $(cat /sys/module/nvidia/version 2>/dev/null || echo none)"
	echo "util-linux: $(timeout 5 dmesg --version 2>&1 | head -1)"
	echo "systemd: $(timeout 5 journalctl --version 2>&1 | head -1)"
	echo "python: $(timeout 5 "$PY" --version 2>&1)"
	echo "pynvml: $(timeout 10 "$PY" -c 'import pynvml; print(pynvml.__file__)' 2>&1 | tail -1)"
	echo "TZ: $(date +%Z%z)"
} >"$OUT/env.txt"

# --- nvidia-smi text -------------------------------------------------------------------------
cap smi/q.txt nvidia-smi -q
cap smi/q_ecc.txt nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER
cap smi/nvlink_s.txt nvidia-smi nvlink -s
cap smi/nvlink_e.txt nvidia-smi nvlink -e
# The field lists are read from the parser's source, without importing the package (whose
# dependencies this machine may lack), so the CSVs are exactly what the checks ask for.
FIELDS="$(timeout 20 python3 -c '
import ast, sys
tree = ast.parse(open("prolog_epilog/smi_parsers.py").read())
lists = {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
         for t in n.targets if isinstance(t, ast.Name) and t.id.endswith("_FIELDS")}
for name, key in (("gpus", "GPU_FIELDS"), ("pcie", "PCIE_FIELDS"), ("thermal", "THERMAL_FIELDS"),
                  ("apps", "APPS_FIELDS")):
    print(name, ",".join(lists[key]))
')"
while read -r name fields; do
	[ -n "$name" ] || continue
	query="--query-gpu"
	[ "$name" = apps ] && query="--query-compute-apps"
	cap "smi/query_$name.csv" nvidia-smi "$query=$fields" --format=csv,noheader,nounits
done <<<"$FIELDS"

# --- kernel log in every form the xid check reads ---------------------------------------------
grep '^btime ' /proc/stat >"$OUT/klog/proc_stat_btime.txt"
cat /proc/uptime >"$OUT/klog/proc_uptime.txt"
cap klog/dmesg_raw.txt dmesg
cap klog/dmesg_r.txt dmesg -r
cap klog/dmesg_T.txt dmesg -T
cap klog/dmesg_iso.txt dmesg --time-format=iso
cap klog/dmesg_x.txt dmesg -x
cap klog/dmesg_x_iso.txt dmesg -x --time-format=iso
for mode in short short-precise short-iso short-iso-precise short-monotonic; do
	cap "klog/journalctl_k_$mode.txt" journalctl -k -b --no-pager -n 5000 -o "$mode"
done

# --- records from both GPU sources ------------------------------------------------------------
T=120 cap records/sources.json "$PY" - <<'PY'
"""Every record NvmlSource and SmiSource produce here, side by side."""
import dataclasses
import json
import traceback

from prolog_epilog.gpu_source import NvmlSource, SmiSource

out = {}
for source in (NvmlSource(), SmiSource()):
    got = {}
    for method in ("gpus", "ecc", "nvlink_status", "nvlink_errors", "pcie", "thermal", "processes"):
        try:
            value = getattr(source, method)(30.0)
        except Exception:
            got[method] = {"error": traceback.format_exc(limit=3)}
            continue
        items = [x for part in value for x in part] if method == "ecc" else value
        got[method] = [dataclasses.asdict(x) for x in items]
    out[source.kind] = got
print(json.dumps(out, indent=1, sort_keys=True, default=str))
PY
cap records/diff.txt "$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
a, b = d.get("nvml", {}), d.get("nvidia-smi", {})
for key in sorted(set(a) | set(b)):
    if a.get(key) != b.get(key):
        print(f"--- {key}\nnvml:       {json.dumps(a.get(key))}\nnvidia-smi: {json.dumps(b.get(key))}")
' "$OUT/records/sources.json"

# --- the suite with each source, and their verdicts compared ----------------------------------
FTHSDP=("$PY" -c 'from fthsdp_cli.main import cli; cli()')
for src in nvml nvidia-smi; do
	cap "check/check_$src.json" "${FTHSDP[@]}" check --json --gpu-source "$src"
done
cap check/diff.txt "$PY" -c '
import json, sys
def load(p):
    try:
        return {c["name"]: (c["status"], c["detail"]) for c in json.load(open(p))["checks"]}
    except Exception as exc:
        return {"<unreadable>": (str(exc), p)}
a, b = load(sys.argv[1]), load(sys.argv[2])
for name in sorted(set(a) | set(b)):
    mark = "same" if a.get(name) == b.get(name) else "DIFF"
    print(f"{mark} {name}\n  nvml:       {a.get(name)}\n  nvidia-smi: {b.get(name)}")
' "$OUT/check/check_nvml.json" "$OUT/check/check_nvidia-smi.json"

# --- timing: the default suite and each check alone, both sources -----------------------------
T=420 cap timing/suite.json "$PY" - <<'PY'
"""Wall seconds of the suite and of each check, 3 runs, with each GPU source."""
import json
import statistics
import time

from prolog_epilog import load_config, run_checks

cfg = load_config()
every = ["gpu-count", "ecc", "nvlink", "infiniband", "xid", "pcie", "thermal", "gpu-procs", "disk"]
out = {}
for src in ("nvml", "nvidia-smi"):
    for label, names in [("default suite", None), ("all checks", every)] + [(n, [n]) for n in every]:
        times, statuses = [], []
        for _ in range(3):
            t0 = time.monotonic()
            res = run_checks(names, cfg, gpu_source=src)
            times.append(time.monotonic() - t0)
            statuses.append({c.name: c.status for c in res.checks})
        out[f"{src}: {label}"] = {
            "median_s": round(statistics.median(times), 4),
            "max_s": round(max(times), 4),
            "statuses": statuses[-1],
        }
print(json.dumps(out, indent=1))
PY

{
	echo "exit codes (0 = ok):"
	for rc in $(cd "$OUT" && find . -name '*.rc' | sort); do
		printf '  %-45s %s\n' "${rc%.rc}" "$(cat "$OUT/$rc")"
	done
	echo
	cat "$OUT/check/diff.txt" 2>/dev/null
} >"$OUT/SUMMARY.txt"
cat "$OUT/SUMMARY.txt"
