"""dcgm (optional): NVIDIA DCGM's own diagnostic, `dcgmi diag -r <level> -j`.

Level 1 takes seconds and covers deployment problems (driver, persistence mode, permissions,
page retirement, inforom); higher levels run stress tests and take minutes, which is why the
check is off by default and a job asks for it explicitly. The JSON has changed shape across DCGM
releases (3.x nests `DCGM GPU Diagnostic -> test_categories -> tests -> results`, 4.x lists
`tests` with per-entity `results`), so the verdict walks the document for every `status` field
rather than trusting one schema. dcgmi exits 205 when a test failed but the JSON is complete:
that is a verdict, not a crash.
"""

from __future__ import annotations

import json
from typing import Any

from prolog_epilog.checks.base import CheckContext, CheckResult, Findings
from prolog_epilog.tools import run_tool


def _walk(node: Any, test: str, out: list[tuple[str, str, str]]) -> None:
    if isinstance(node, dict):
        name = node.get("name") or node.get("test_name") or test
        status = node.get("status")
        if isinstance(status, str):
            info = node.get("warnings") or node.get("info") or ""
            if isinstance(info, list):
                info = " ".join(
                    str(i.get("warning", i)) if isinstance(i, dict) else str(i) for i in info
                )
            gpu = node.get("gpu_ids") or node.get("entity_id") or ""
            out.append((str(name), status, f"{gpu} {info}".strip()))
        for value in node.values():
            _walk(value, str(name), out)
    elif isinstance(node, list):
        for item in node:
            _walk(item, test, out)


def parse_dcgm_json(text: str) -> tuple[list[tuple[str, str, str]], str | None]:
    """([(test, status, note)], runtime error) from dcgmi's JSON; tolerant of leading noise."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON in dcgmi output")
    data = json.loads(text[start:])
    results: list[tuple[str, str, str]] = []
    _walk(data, "", results)
    err = None
    if isinstance(data, dict):
        root = data.get("DCGM GPU Diagnostic", data)
        if isinstance(root, dict):
            err = root.get("runtime_error") or root.get("error")
    return results, (str(err) if err else None)


def judge(results: list[tuple[str, str, str]], runtime_error: str | None) -> CheckResult:
    f = Findings("dcgm")
    if runtime_error:
        f.add("fail", f"dcgmi: {runtime_error[:120]}", "dcgm runtime error")
    for test, status, note in results:
        s = status.strip().lower()
        if s.startswith("fail"):
            f.add("fail", f"{test}: FAIL {note}"[:160], f"dcgm {test}")
        elif s.startswith("warn"):
            f.add("warn", f"{test}: WARN {note}"[:160])
    if not results and not runtime_error:
        return CheckResult("dcgm", "error", "dcgmi produced no test results", "dcgm no results")
    return f.result(f"{len(results)} DCGM results pass")


def run(ctx: CheckContext) -> CheckResult:
    cfg = ctx.config.section("dcgm")
    argv = [ctx.config.path("dcgmi"), "diag", "-r", str(cfg["level"]), "-j"]
    out = run_tool(argv, ctx.remaining(), ok_codes=list(cfg["ok_codes"]))
    results, err = parse_dcgm_json(out.stdout)
    return judge(results, err)
