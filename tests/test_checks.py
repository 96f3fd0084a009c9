"""The ledger of every check (models/checks.py): the table in docs/models.md is drawn from it,
its figures with the network as the unit are computed from it, and a check's rows come from
stage=compare's reports (their real making is exercised in test_train's leave-one-network-out
test)."""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from models import checks

DOCS = Path(__file__).resolve().parents[1] / "docs" / "models.md"
HEADER = "## Networks never measured: every check in one table"


def _ledger(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=checks.COLUMNS).assign(network=lambda d: d["network"].fillna(""))


def test_the_table_in_the_docs_is_the_ledgers():
    """Every row of the table of every check in docs/models.md, and its row of each check's
    means, is the committed ledger's, in its order: nothing in the table is copied by hand."""
    section = DOCS.read_text().split(HEADER, 1)[1].split("\n## ")[0]
    shown = [line for line in section.splitlines()
             if re.match(r"^\| [^|]+\(v\d+\) \|", line) or line.startswith("| mean of each check's networks")]
    assert shown == checks.table_rows(checks.read())


def test_tally_counts_each_network_once_as_the_table_rounds_it():
    led = _ledger([
        dict(release="r-v2", network="a", label="A", seeds=6, random=0.2, ms_xgb=0.6001, model=0.7, diff=0.1,
             lo=0.02, hi=0.2),
        dict(release="r-v2", network="b", label="B", seeds=6, random=0.3, ms_xgb=0.5, model=0.4, diff=-0.1,
             lo=-0.2, hi=0.01),
        dict(release="r-v2", network=None, label="", seeds=6, random=0.25, ms_xgb=0.55, model=0.55, diff=0.0,
             lo=-0.05, hi=0.05, pair_diff=0.03, pair_won=10, pair_runs=12),
        # level: the same top-1 to three decimals
        dict(release="r-v1", network="c", label="C", seeds=9, random=0.1, ms_xgb=0.8003, model=0.7998, diff=-0.0005,
             lo=-0.01, hi=0.01),
        dict(release="r-v1", network=None, label="", seeds=9, random=0.1, ms_xgb=0.8003, model=0.7998,
             diff=-0.0005, lo=-0.01, hi=0.01, pair_diff=0.05, pair_won=9, pair_runs=9),
    ])
    t = checks.tally(led, resamples=2000)
    assert (t["networks"], t["checks"], t["ahead"], t["behind"], t["level"]) == (3, 2, 1, 1, 1)
    assert t["mean_diff"] == pytest.approx(0.0) and t["lo"] < 0 < t["hi"]
    assert t["p"] == pytest.approx(stats.wilcoxon([0.1, -0.1, 0.0]).pvalue)
    assert t["interval_above_zero"] == 1 and t["checks_interval_above_zero"] == 0
    assert (t["pair_won"], t["pair_runs"]) == (19, 21)
    assert t["checks_reaching_goal"] == 1  # v1's 0.800; v2's mean 0.550 falls short
    assert t["model"] == pytest.approx(np.mean([0.7, 0.4, 0.8]))
    rows = checks.table_rows(led)
    assert rows[0] == "| A (v2) | 0.200 | 0.600 | 0.700 | **+0.100 [+0.020, +0.200]** |"
    assert rows[2] == "| C (v1) | 0.100 | 0.800 | 0.800 | -0.001 [-0.010, +0.010] |"
    assert rows[3].startswith("| mean of each check's networks: v2 / v1 | 0.250 / 0.100 |")


def test_a_check_replaces_its_release_and_keeps_the_order():
    old = checks.read()
    newest = old[old["release"] == old["release"].iloc[0]].assign(release="zoo_ops-llvm-epyc2-v999")
    grown = checks.add(old, newest)
    assert len(grown) == len(old) + len(newest) and grown["release"].iloc[0] == "zoo_ops-llvm-epyc2-v999"
    again = checks.add(grown, newest.assign(model=newest["model"] + 0.01))
    assert len(again) == len(grown)
    assert (again.loc[again["release"] == "zoo_ops-llvm-epyc2-v999", "model"].to_numpy()
            == pytest.approx(newest["model"].to_numpy() + 0.01))


def test_bad_inputs_name_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no heldout report; run stage=compare .*compare.pairs="):
        checks.rows_from_reports(tmp_path, "zoo_ops-llvm-epyc2-v38", {"xception": "Xception"})
    with pytest.raises(ValueError, match=r"release 'v38-final': a release name ends in -v<N>"):
        checks.version("v38-final")
    with pytest.raises(FileNotFoundError, match="pass --ledger"):
        checks.read(tmp_path / "nothing.csv")
    (tmp_path / "bad.csv").write_text("release,network\nx-v1,a\n")
    with pytest.raises(ValueError, match=r"bad.csv: columns \[.*'label'.*\] are missing"):
        checks.read(tmp_path / "bad.csv")


def test_each_checks_means_are_those_of_its_networks():
    """A check's row holds the means of its networks' rows (to the table's rounding), its seeds
    are its networks' most, and a one-network check's interval is its network's."""
    ledger = checks.read()
    nets = checks.networks(ledger)
    for check in checks.checks(ledger).itertuples():
        mine = nets[nets["release"] == check.release]
        assert len(mine), check.release
        for column in ("random", "ms_xgb", "model"):
            assert abs(mine[column].mean() - getattr(check, column)) <= 0.0015, (check.release, column)
        assert check.seeds == mine["seeds"].max() and 0 <= check.pair_won <= check.pair_runs
        if len(mine) == 1:
            assert (check.diff, check.lo, check.hi) == tuple(mine[["diff", "lo", "hi"]].iloc[0])
