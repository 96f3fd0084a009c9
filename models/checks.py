"""The ledger of every check on networks never measured, and the figures drawn from it.

Each check holds out the new networks of a release; stage=compare writes its figures to the
workspace's reports/, which are not kept once the workspace is gone. The ledger
(docs/checks.csv) keeps what the checks found: one row per held-out network (its test top-1
for a random pick, `ms_xgb` and the model under test, the model minus `ms_xgb` with its
interval over the network's tasks) and one row per check (network empty: the means over its
networks, the check's interval, pairwise accuracy minus `ms_xgb` with the runs won). The table
of every check in docs/models.md and the figures with the network as the unit are drawn from
it, so that none is copied by hand:

    python -m models.checks add --release zoo_ops-llvm-epyc2-v38 --label Xception --reports <workspace>/reports
    python -m models.checks show
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import pandas as pd

from models.evaluation import bootstrap_interval

LEDGER = Path(__file__).resolve().parents[1] / "docs" / "checks.csv"
COLUMNS = ["release", "network", "label", "seeds", "random", "ms_xgb", "model", "diff", "lo", "hi", "pair_diff",
           "pair_won", "pair_runs"]
MODEL, REFERENCE = "ens_ps_rank4_fixed", "ms_xgb"
GOAL_TOP1 = 0.65
SELECTION = "by_network-static"


def read(path: Path = LEDGER) -> pd.DataFrame:
    """The ledger, newest check first; a clear error where it is not one."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no ledger of checks here; pass --ledger the path of docs/checks.csv")
    ledger = pd.read_csv(path, keep_default_na=False, na_values=[""], dtype={"network": str, "label": str})
    missing = [c for c in COLUMNS if c not in ledger.columns]
    if missing:
        raise ValueError(f"{path}: columns {missing} are missing; a ledger has {COLUMNS}")
    ledger[["network", "label"]] = ledger[["network", "label"]].fillna("")
    return ledger[COLUMNS].astype({"seeds": int, "pair_won": "Int64", "pair_runs": "Int64"})


def version(release: str) -> str:
    """'zoo_ops-llvm-epyc2-v37' -> 'v37'."""
    found = re.search(r"-(v\d+)$", release)
    if not found:
        raise ValueError(f"release {release!r}: a release name ends in -v<N> (e.g. zoo_ops-llvm-epyc2-v38)")
    return found.group(1)


def _ordered(ledger: pd.DataFrame) -> pd.DataFrame:
    """Newest release first; within one, the order the rows were added."""
    number = ledger["release"].map(lambda r: int(version(r)[1:]))
    return ledger.assign(_n=number, _i=range(len(ledger))).sort_values(["_n", "_i"], ascending=[False, True]) \
        .drop(columns=["_n", "_i"]).reset_index(drop=True)


def networks(ledger: pd.DataFrame) -> pd.DataFrame:
    return ledger[ledger["network"] != ""]


def checks(ledger: pd.DataFrame) -> pd.DataFrame:
    return ledger[ledger["network"] == ""]


def rows_from_reports(reports: Path, release: str, labels: dict[str, str], *, model: str = MODEL,
                      reference: str = REFERENCE, selection: str = SELECTION) -> pd.DataFrame:
    """A check's rows from stage=compare's reports of it (run with `compare.pairs` holding
    [model, reference]): heldout-<sel>.csv (top-1 per network and model, the random pick's
    among them), pairs-<sel>.csv (model minus reference over each network's tasks) and
    margins-<sel>.csv (pairwise accuracy minus reference, paired over the runs). `labels` maps
    each held-out network to the name the table shows ("" to a name: the one network's)."""
    reports, _ = Path(reports), version(release)
    need = {k: reports / f"{k}-{selection}.csv" for k in ("heldout", "pairs", "margins")}
    for kind, path in need.items():
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no {kind} report; run stage=compare for the check first, "
                                    f"with compare.pairs=[[{model},{reference}]]")
    heldout = pd.read_csv(need["heldout"], keep_default_na=False, na_values=[""])
    pairs = pd.read_csv(need["pairs"], keep_default_na=False, na_values=[""])
    margins = pd.read_csv(need["margins"])
    nets = [h for h in dict.fromkeys(heldout["heldout"]) if h != "mean"]
    if "" in labels:
        if len(nets) != 1 or len(labels) != 1:
            raise ValueError(f"a label without a network names the one held-out network; {need['heldout']} "
                             f"holds {nets}: pass --label network=NAME for each")
        labels = {nets[0]: labels[""]}
    unnamed = sorted(set(nets) - set(labels))
    if unnamed:
        raise ValueError(f"held-out network(s) {unnamed} of {need['heldout']} have no label: pass --label for each")
    by_model = heldout.set_index(["heldout", "model"])
    top1 = by_model["test_top1_score"]
    pair = pairs[(pairs["model"] == model) & (pairs["reference"] == reference)].set_index("heldout")
    rows = []
    for net in nets:
        if (net, model) not in top1.index or net not in pair.index:
            raise ValueError(f"{reports}: no {model} minus {reference} for {net}; "
                             f"run stage=compare with compare.pairs=[[{model},{reference}]]")
        rows.append({"release": release, "network": net, "label": labels[net],
                     "seeds": int(by_model.loc[(net, model), "n_seeds"]),
                     "random": top1[(net, "random")], "ms_xgb": top1[(net, reference)], "model": top1[(net, model)],
                     "diff": pair.loc[net, "diff"], "lo": pair.loc[net, "lo"], "hi": pair.loc[net, "hi"]})
    net_rows = pd.DataFrame(rows)
    margin = margins[(margins["model"] == model) & (margins["reference"] == reference)
                     & (margins["metric"] == "test_pair_acc")]
    if margin.empty:
        raise ValueError(f"{need['margins']}: no test_pair_acc of {model} minus {reference}; "
                         f"run stage=compare with compare.pairs=[[{model},{reference}]]")
    check = {"release": release, "network": "", "label": "", "seeds": int(net_rows["seeds"].max()),
             **net_rows[["random", "ms_xgb", "model"]].mean().to_dict(),
             "pair_diff": float(margin["diff"].iloc[0]), "pair_won": int(margin["won"].iloc[0]),
             "pair_runs": int(margin["n_runs"].iloc[0])}
    if len(nets) == 1:  # the check's interval is its network's
        check.update({k: net_rows[k].iloc[0] for k in ("diff", "lo", "hi")})
    elif "mean" in pair.index:
        check.update({k: pair.loc["mean", k] for k in ("diff", "lo", "hi")})
    return pd.DataFrame([*net_rows.to_dict("records"), check], columns=COLUMNS)


def add(ledger: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The ledger with a check's rows, replacing any it held for that release."""
    releases = set(rows["release"])
    kept = ledger[~ledger["release"].isin(releases)]
    return _ordered(pd.concat([kept, rows[COLUMNS]], ignore_index=True))


def write(ledger: pd.DataFrame, path: Path = LEDGER) -> None:
    _ordered(ledger).to_csv(path, index=False, float_format="%.6g")


def _interval(diff: float, lo: float, hi: float) -> str:
    if pd.isna(lo):
        return f"{diff:+.3f}"
    text = f"{diff:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    return f"**{text}**" if lo > 0 else text


def table_rows(ledger: pd.DataFrame) -> list[str]:
    """The table of every check as docs/models.md shows it: a row per network, newest check
    first (an interval above zero in bold), and a last row of each check's means."""
    ledger = _ordered(ledger)
    out = [f"| {r.label} ({version(r.release)}) | {r.random:.3f} | {r.ms_xgb:.3f} | {r.model:.3f} | "
           f"{_interval(r.diff, r.lo, r.hi)} |" for r in networks(ledger).itertuples()]
    c = checks(ledger)
    out.append("| mean of each check's networks: " + " / ".join(version(r) for r in c["release"]) + " | "
               + " | ".join(" / ".join(f"{v:.3f}" for v in c[k]) for k in ("random", "ms_xgb", "model")) + " | "
               + " / ".join(_interval(r.diff, r.lo, r.hi) for r in c.itertuples()) + " |")
    return out


def tally(ledger: pd.DataFrame, *, resamples: int = 100_000, level: float = 0.90, seed: int = 0) -> dict:
    """The figures with the network as the unit: each network's top-1 difference once (as the
    table rounds them), its mean with a bootstrap interval over the networks and a Wilcoxon
    signed-rank p; networks ahead, behind and level, and with the interval above zero; mean
    top-1 of each column; checks whose interval is above zero and whose mean reaches the goal;
    runs won on pairwise accuracy."""
    from scipy import stats

    nets, done = networks(ledger), checks(ledger)
    d = (nets["model"].round(3) - nets["ms_xgb"].round(3)).round(3).to_numpy()
    lo, hi = bootstrap_interval(d, resamples, level, seed)
    return {"networks": len(d), "checks": len(done), "mean_diff": float(d.mean()), "lo": lo, "hi": hi,
            "p": float(stats.wilcoxon(d).pvalue) if len(d) > 1 and (d != 0).any() else float("nan"),
            "ahead": int((d > 0).sum()), "behind": int((d < 0).sum()), "level": int((d == 0).sum()),
            "interval_above_zero": int((nets["lo"] > 0).sum()),
            "random": float(nets["random"].round(3).mean()), "ms_xgb": float(nets["ms_xgb"].round(3).mean()),
            "model": float(nets["model"].round(3).mean()),
            "checks_interval_above_zero": int((done["lo"] > 0).sum()),
            "checks_reaching_goal": int((done["model"].round(3) >= GOAL_TOP1).sum()),
            "pair_won": int(done["pair_won"].sum()), "pair_runs": int(done["pair_runs"].sum())}


def summary(ledger: pd.DataFrame) -> str:
    t = tally(ledger)
    pairs = ", ".join(f"{v:+.3f}" for v in _ordered(ledger).pipe(checks)["pair_diff"])
    return "\n".join([
        f"{t['checks']} checks, {t['networks']} networks: {MODEL} minus {REFERENCE} on test top-1, network as the "
        f"unit: mean {t['mean_diff']:+.3f} [{t['lo']:+.3f}, {t['hi']:+.3f}] (90%, bootstrap over the networks), "
        f"Wilcoxon p = {t['p']:.3g}",
        f"ahead on {t['ahead']}, behind on {t['behind']}, level on {t['level']}; interval over the tasks above zero "
        f"on {t['interval_above_zero']} networks and on {t['checks_interval_above_zero']} checks' means",
        f"mean top-1 over the networks: {MODEL} {t['model']:.3f}, {REFERENCE} {t['ms_xgb']:.3f}, "
        f"random {t['random']:.3f}; the check's mean at least {GOAL_TOP1} on {t['checks_reaching_goal']} "
        f"of {t['checks']}",
        f"pairwise accuracy ahead in {t['pair_won']} of {t['pair_runs']} runs ({pairs} per check, newest first)"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m models.checks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledger", type=Path, default=LEDGER)
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="print the table of every check and the figures with the network as unit")
    show.add_argument("--table", action="store_true", help="the table's rows too")
    new = sub.add_parser("add", help="add (or replace) a check's rows from stage=compare's reports")
    new.add_argument("--release", required=True, help="the release the check ran on, e.g. zoo_ops-llvm-epyc2-v38")
    new.add_argument("--reports", required=True, type=Path, help="the reports/ folder of the check's workspace")
    new.add_argument("--label", action="append", required=True,
                     help="the table's name of a held-out network: 'Xception' (one network) or 'xception=Xception'")
    new.add_argument("--model", default=MODEL)
    new.add_argument("--reference", default=REFERENCE)
    args = parser.parse_args(argv)
    ledger = read(args.ledger)
    if args.command == "add":
        labels = dict(label.split("=", 1) if "=" in label else ("", label) for label in args.label)
        ledger = add(ledger, rows_from_reports(args.reports, args.release, labels, model=args.model,
                                               reference=args.reference))
        write(ledger, args.ledger)
    if args.command == "show" and args.table or args.command == "add":
        print("\n".join(table_rows(ledger)))
    print(summary(ledger))


if __name__ == "__main__":
    main()
