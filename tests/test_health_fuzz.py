"""Garbage in never raises out of a parser or a check (hypothesis)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from prolog_epilog import smi_parsers as smi
from prolog_epilog.checks import dcgm, ecc, nvlink
from prolog_epilog.config import load_config
from prolog_epilog.fabric import parse_ibstat, parse_rate
from prolog_epilog.kernel_log import parse_xid_lines

FIX = Path(__file__).parent / "fixtures" / "health"
CFG = load_config()
SEEDS = [
    (FIX / n).read_text()
    for n in ("q_h100_r550_parity_secded.txt", "nvlink_s_h100.txt", "dmesg_T.txt")
]
text = st.one_of(
    st.text(max_size=400),
    st.sampled_from(SEEDS).flatmap(
        lambda s: st.tuples(st.integers(0, len(s)), st.text(max_size=40)).map(
            lambda t: s[: t[0]] + t[1] + s[t[0] :]
        )
    ),
)


@settings(max_examples=150, deadline=None)
@given(text)
def test_smi_parsers_and_verdicts_never_raise(data: str) -> None:
    tree = smi.parse_query(data)
    eccs, rows, pages = (
        smi.ecc_from_query(tree),
        smi.remapped_rows_from_query(tree),
        smi.retired_pages_from_query(tree),
    )
    assert ecc.judge(eccs, rows, pages, CFG.section("ecc")).status in ("pass", "warn", "fail")
    status, errors = smi.parse_nvlink_status(data), smi.parse_nvlink_errors(data)
    assert nvlink.judge(status, errors, CFG.section("nvlink")).status in ("pass", "warn", "fail")
    for parse in (
        smi.gpus_from_csv,
        smi.pcie_from_csv,
        smi.thermal_from_csv,
        smi.processes_from_csv,
    ):
        parse(data)
    parse_ibstat(data)
    parse_rate(data)
    for e in parse_xid_lines(data, boot_time=0.0):
        assert isinstance(e.code, int)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_dcgm_garbage_is_a_value_error_not_a_crash(data: str) -> None:
    try:
        results, err = dcgm.parse_dcgm_json(data)
    except ValueError:  # json.JSONDecodeError is a ValueError: the runner reports "error"
        return
    dcgm.judge(results, err)
