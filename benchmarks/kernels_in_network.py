"""Kept runs' tuned kernels timed inside the network, beside the kernels no record touched.

    python benchmarks/kernels_in_network.py FOLDER [overrides] [--runs xgb-s0,ours_adapt-<hash>-s0] [--rounds 10] [--calls 5]

FOLDER holds a network's kept runs (as for `kept_runs_on_this_machine.py`; the Hydra overrides
build the network as the comparison's stage=tune did). Each run's network is compiled once with
its database; then in `--rounds` rounds, every network in an order drawn anew, each is called
`--calls` times with every call inside it timed (the Relax VM's instrument, before and after each
call). A call's time splits into the functions the run's records replaced (the tuned tasks) and
the rest, which is the same code in every run's network. Printed: per run the median over calls
and rounds of the tuned part, the rest and the whole call; then, paired with `xgb-s<seed>` in the
same round, XGBModel's / each run's for the three parts (`tune.retime`'s pairing: the geometric
mean over (seed, round) pairs, its 90% interval over rounds, each seed's). Where the whole
network's ratio is no further from 1 than the rest's, an end-to-end difference of that size is the machine's state, not the tuning; the tuned part's
ratio is the in-network reading of the tuning itself.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path

import pandas as pd
from kept_runs_on_this_machine import fail, kept_runs_and_network, kept_runs_parser  # the script's folder

SCRIPT = "kernels_in_network"
PARTS = ("tuned", "rest", "network")


def main() -> None:
    p = kept_runs_parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--calls", type=int, default=5, help="timed calls per network and round")
    p.add_argument("--seed", type=int, default=0, help="draws the order of the networks in each round")
    args = p.parse_args()
    import tvm
    from tvm import relax

    from pipeline.tuning.comparison import open_database
    from pipeline.tuning.retime import paired
    from pipeline.tuning.runs import compile_with_database

    folder = args.folder
    names, _, net, target = kept_runs_and_network(args, SCRIPT)
    if args.rounds < 1 or args.calls < 1:
        fail(f"--rounds {args.rounds} --calls {args.calls}: time at least one round of one call", SCRIPT)
    if target.kind.name != "llvm":
        fail(f"target {target.kind.name}: the VM's instrument times host calls; time CPU networks only", SCRIPT)
    dev = tvm.cpu()
    inputs = [tvm.runtime.tensor(x, dev) for x in net.inputs]

    networks = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in names:
            ex, replaced = compile_with_database(open_database(folder / name, Path(scratch) / name), net.mod, target)
            vm = relax.VirtualMachine(ex, dev)
            vm["main"](*inputs)  # warm-up
            networks[name] = (vm, set(replaced))
    print(f"{net.name}: {len(networks)} networks compiled; {args.rounds} rounds x {args.calls} calls; "
          f"load average {os.getloadavg()[0]:.2f}")

    rows = []
    order = list(networks)
    rng = random.Random(args.seed)
    for rnd in range(args.rounds):
        rng.shuffle(order)
        for name in order:
            vm, replaced = networks[name]
            parts = {"tuned": 0.0, "rest": 0.0}
            started: dict = {}

            def instrument(func, symbol, before, ret, *call_args):
                if before:
                    started[symbol] = time.perf_counter()
                else:
                    parts["tuned" if symbol in replaced else "rest"] += time.perf_counter() - started.pop(symbol)
                return 0

            vm.set_instrument(instrument)
            for call in range(args.calls):
                parts.update(tuned=0.0, rest=0.0)
                t0 = time.perf_counter()
                vm["main"](*inputs)
                rows.append({"run": name, "round": rnd, "call": call, "tuned": parts["tuned"],
                             "rest": parts["rest"], "network": time.perf_counter() - t0})
    load = os.getloadavg()[0]
    t = pd.DataFrame(rows)
    per_round = t.groupby(["run", "round"], as_index=False)[list(PARTS)].median()
    print((per_round.groupby("run")[list(PARTS)].median() * 1e3).round(2)
          .rename(columns=lambda c: f"{c} ms").to_string())
    # the run folder's name is <cost model>[-<settings digest>]-s<seed>: the label keeps the digest
    label, seed = zip(*(n.rsplit("-s", 1) for n in per_round["run"]))
    per_round = per_round.assign(cost_model=label, seed=[int(x) for x in seed])
    if "xgb" not in set(label):
        print("no xgb-s<seed> run among the runs: nothing to pair with")
        return
    print(f"\nXGBModel's / this, paired by seed and round (geometric mean, 90% over rounds); "
          f"load average {load:.2f}")
    for part in PARTS:
        table = paired(per_round.rename(columns={part: "e2e_ms"}))
        table = table[table["cost_model"] != "xgb"][["cost_model", "seeds", "xgb/this", "lo", "hi", "per_seed"]]
        print(f"{part}:\n{table.round(3).to_string(index=False)}")


if __name__ == "__main__":
    main()
