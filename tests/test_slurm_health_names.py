"""The health-check vocabulary a spec accepts is the set of checks prolog_epilog implements."""

from __future__ import annotations

from prolog_epilog.checks import CHECK_MODULES
from slurm.health_names import CHECK_NAMES


def test_every_check_name_has_exactly_one_check_module() -> None:
    assert tuple(CHECK_MODULES) == CHECK_NAMES
