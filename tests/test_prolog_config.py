"""`prolog_epilog.config`: a bad check name or key is named in the error."""

from __future__ import annotations

import pytest
from health_harness import CFG

from prolog_epilog import load_config, run_checks
from slurm.errors import InputError


def test_config_errors_name_the_key(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text("[general]\ntotal_budjet_s = 3\n")
    with pytest.raises(InputError, match=r"general\.total_budjet_s"):
        load_config(bad)
    bad.write_text("[checks.ecc]\nvolatile_uncorrectable_max = 'zero'\n")
    with pytest.raises(InputError, match="must be an integer"):
        load_config(bad)
    with pytest.raises(InputError, match="allowed"):
        run_checks(["ecc", "nope"], CFG)
