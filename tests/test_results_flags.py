"""A victim batch's flag column (e.g. attack_success) reads back from a results CSV as numbers.

`scoring._joined_column` gives a bool where a run's victims agree and their share where they differ,
so one CSV column mixes "True"/"False" with shares: the board export of board-fedsgd refused it as a
damaged file. Anything else that is not a number still is refused.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest

from fedbench.errors import FedbenchError
from fedbench.reporting.results import _check_numbers


def test_a_flag_column_mixing_bools_and_shares_reads_as_numbers():
    frame = pd.read_csv(io.StringIO("attack_success,seed\nFalse,0\n0.3,1\nTrue,2\n,3\n"))
    values = _check_numbers(frame, Path("r.csv"))["attack_success"].tolist()
    assert values[:3] == [0.0, 0.3, 1.0] and pd.isna(values[3])


def test_a_text_cell_in_a_numeric_column_is_still_refused():
    frame = pd.read_csv(io.StringIO("attack_success,seed\nmaybe,0\n"))
    with pytest.raises(FedbenchError, match="column 'attack_success' holds a non-number \\('maybe'\\)"):
        _check_numbers(frame, Path("r.csv"))
