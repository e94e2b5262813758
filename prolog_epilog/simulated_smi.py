"""The stand-in `nvidia-smi` used by simulated dev-cluster nodes (stdlib only, self-contained).

`simulated_hardware.write_node_inputs` copies this file's source into a node's `bin/nvidia-smi`
with an absolute interpreter line. It answers the invocations the health checks make, from the
fixture files beside it in `../smi/`, in nvidia-smi's own output formats:

- `-q [-d ECC,ROW_REMAPPER,...] [-i N]`: sections of `q.txt` (a full `-q` log)
- `--query-gpu=f1,f2 --format=csv[,noheader][,nounits]`: columns of `query_gpu.csv`
- `--query-compute-apps=...`: columns of `compute_apps.csv`
- `nvlink -s` / `nvlink -e`: `nvlink_s.txt` / `nvlink_e.txt`
- `-L`: one line per GPU

A file `hang` beside the fixtures makes it sleep forever (a GPU wedged in the driver).
"""

import csv
import io
import os
import sys
import time

SECTIONS = {
    "ECC": ("ecc mode", "ecc errors"),
    "ROW_REMAPPER": ("remapped rows",),
    "PAGE_RETIREMENT": ("retired pages",),
    "TEMPERATURE": ("temperature",),
}


def _fixtures() -> str:
    here = os.path.dirname(os.path.realpath(sys.argv[0]))
    return os.path.join(os.path.dirname(here), "smi")


def _read(name: str) -> str:
    with open(os.path.join(_fixtures(), name)) as f:
        return f.read()


def _query(args: list[str]) -> str:
    text = _read("q.txt")
    display = None
    index = None
    if "-d" in args:
        display = args[args.index("-d") + 1].upper().split(",")
    if "-i" in args:
        index = int(args[args.index("-i") + 1])
    if display is None and index is None:
        return text
    wanted = tuple(k for d in display or () for k in SECTIONS.get(d, ()))
    out: list[str] = []
    gpu = -1
    keep = True
    for line in text.splitlines():
        if line.startswith("GPU ") and ":" in line:
            gpu += 1
            keep = True
            if index is None or gpu == index:
                out.append(line)
            continue
        if gpu < 0:
            out.append(line)
            continue
        if index is not None and gpu != index:
            continue
        if line.startswith("    ") and not line.startswith("     "):
            title = line.strip().split(":")[0].strip().lower()
            keep = display is None or title in wanted
        if keep:
            out.append(line)
    return "\n".join(out) + "\n"


def _csv(table: str, spec: str, fmt: str) -> str:
    fields = [f.strip() for f in spec.split(",")]
    rows = list(csv.reader(io.StringIO(table), skipinitialspace=True))
    header, body = rows[0], rows[1:]
    for f in fields:
        if f not in header:
            sys.stderr.write(f'Field "{f}" is not a valid field to query.\n\n')
            sys.exit(2)
    opts = fmt.split(",")
    lines = []
    if "noheader" not in opts:
        lines.append(", ".join(fields))
    for row in body:
        lines.append(", ".join(row[header.index(f)] for f in fields))
    return "\n".join(lines) + ("\n" if lines else "")


def main(argv: list[str]) -> int:
    if os.path.exists(os.path.join(_fixtures(), "hang")):
        while True:
            time.sleep(3600)
    opts = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv if a.startswith("--") and "=" in a}
    fmt = opts.get("--format", "csv")
    if "--query-gpu" in opts:
        sys.stdout.write(_csv(_read("query_gpu.csv"), opts["--query-gpu"], fmt))
    elif "--query-compute-apps" in opts:
        sys.stdout.write(_csv(_read("compute_apps.csv"), opts["--query-compute-apps"], fmt))
    elif argv[:1] == ["nvlink"]:
        if any(a in ("-e", "--errorcounters") for a in argv):
            sys.stdout.write(_read("nvlink_e.txt"))
        else:
            sys.stdout.write(_read("nvlink_s.txt"))
    elif "-q" in argv or "--query" in argv:
        sys.stdout.write(_query(argv))
    elif "-L" in argv:
        table = list(csv.reader(io.StringIO(_read("query_gpu.csv")), skipinitialspace=True))
        h = table[0]
        for row in table[1:]:
            sys.stdout.write(
                f"GPU {row[h.index('index')]}: {row[h.index('name')]} (UUID: {row[h.index('uuid')]})\n"
            )
    else:
        sys.stderr.write("stand-in nvidia-smi: unsupported arguments: " + " ".join(argv) + "\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
