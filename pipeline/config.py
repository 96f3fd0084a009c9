"""The pipeline's Hydra config: composed outside the command line (tests, benchmarks), and
checked before any stage runs.

`validate(cfg)` checks every setting a stage reads as a number, a switch or a name against
the rules in `RULES`, on the composed and resolved config, and returns one line per bad
setting naming the key, the value given and what is valid. The entry point refuses the run
with those lines (exit code 2) before a stage opens the workspace, so a bad value never
gets as far as `force=true` deleting part files.

Why a table of rules over the composed DictConfig rather than Hydra structured configs:
the config is YAML groups whose shape depends on the options chosen (`model=all` puts each
model's config under its own key, `collect=auto` merges two groups, a budget may carry tune
keys or not), so a dataclass schema would have to mirror every group option and be kept in
step with the YAML by hand; and a structured config only checks types (`-1` is a fine
int), not ranges, choices or relations between keys (`shard.index < shard.count`,
test + validation fractions < 1), and reports a type error as a multi-line OmegaConf
error. The rules check exactly the keys that exist in the composed config (a rule whose
key a group does not have is skipped), after interpolation (`sample.strategies` comes
from the budget through `oc.select`), and the valid names of a choice are read from the
code that uses them (e.g. `pipeline.stages.sample.STRATEGIES`), resolved by dotted path
as Hydra resolves a `_target_`, so there is one list of names.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline import stages
from pipeline.core.errors import PipelineError

# The configs live in the repository's top-level conf/; the wheel installs that folder as the
# package `pipeline.conf` (pyproject.toml), read through Hydra's `pkg://` search path.
CONF_PACKAGE = "pipeline.conf"
CHECKOUT_CONF = Path(__file__).resolve().parent.parent / "conf"


def in_checkout() -> bool:
    """Whether this package runs from this project's source checkout (conf/ and pyproject.toml
    beside it), not from site-packages, where another project may have installed a `conf`."""
    pyproject = CHECKOUT_CONF.parent / "pyproject.toml"
    return (CHECKOUT_CONF / "config.yaml").is_file() and pyproject.is_file() and \
        'name = "tensor-cost-pipeline"' in pyproject.read_text(errors="replace")


def conf_source() -> str:
    """Hydra's primary config source: the checkout's conf/ folder when this package runs from a
    source checkout (editable install or PYTHONPATH), so edits there count at once; else the
    installed copy, `pkg://pipeline.conf`. Users add their own folders with `hydra.searchpath`."""
    return str(CHECKOUT_CONF) if in_checkout() else f"pkg://{CONF_PACKAGE}"


def conf_dir() -> Path:
    """The folder the configs are read from (a checkout's conf/ or the installed pipeline/conf)."""
    source = conf_source()
    if not source.startswith("pkg://"):
        return Path(source)
    from importlib.resources import files

    return Path(str(files(CONF_PACKAGE)))


CONF_DIR = conf_dir()


def _release_name(release) -> str:
    """dataset=release's name: the release folder's name, given by name or by path."""
    return Path(str(release)).name if release not in (None, "", "None") else "release"


def _release_workspace(release, labels, tuning_networks=None) -> str:
    """dataset=release's workspace: the release's name, `-relabel` without its labels,
    `+tuning-<networks>` with the kept tuning runs of those networks imported."""
    name = _release_name(release) + ("" if labels in (True, "true", "True") else "-relabel")
    networks = sorted(str(n) for n in (tuning_networks or []))
    return name + (f"+tuning-{'-'.join(networks)}" if networks else "")


OmegaConf.register_new_resolver("release_name", _release_name, replace=True)
OmegaConf.register_new_resolver("release_workspace", _release_workspace, replace=True)


class ConfigError(PipelineError):
    """Settings that no stage can run with; one line per bad setting."""


def hydra_context():
    """Hydra initialized on the pipeline's configs, outside the app (a context manager)."""
    GlobalHydra.instance().clear()
    source = conf_source()
    return (initialize_config_module(config_module=source[len("pkg://"):], version_base="1.3")
            if source.startswith("pkg://") else initialize_config_dir(config_dir=source, version_base="1.3"))


def compose_in_context(overrides: list[str] | None = None, hydra_config: bool = False):
    """compose() inside hydra_context(); `hydra_config` keeps the `hydra` node (its runtime.choices)."""
    return hydra_compose(config_name="config", overrides=list(overrides or []), return_hydra_config=hydra_config)


def compose(overrides: list[str] | None = None):
    """The config `pipeline <overrides>` would run with (tests, benchmarks, notebooks)."""
    with hydra_context():
        return compose_in_context(overrides)


def run_stage(name: str, overrides: list[str] | None = None) -> dict:
    cfg = compose([f"stage={name}", *(overrides or [])])
    check(cfg)
    return stages.run_of(name)(cfg) or {}


# ---------------------------------------------------------------------- rules

_MISSING = object()


@dataclass(frozen=True)
class Rule:
    """What one key may hold: an integer or a number in a range, a switch, or names."""

    kind: str  # int | number | bool | name | names
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    null: str | None = None  # what null means, when null is allowed
    choices: tuple[str, ...] | str = ()  # names, or the dotted path of the code's own list of names

    def valid_names(self) -> tuple[str, ...]:
        names = get_object(self.choices) if isinstance(self.choices, str) else self.choices
        return tuple(str(n) for n in names)

    def describe(self) -> str:
        if self.kind == "bool":
            what = "true or false"
        elif self.kind in ("name", "names"):
            what = ("one of: " if self.kind == "name" else "a non-empty list of: ") + ", ".join(self.valid_names())
        else:
            what = "an integer" if self.kind == "int" else "a number"
            if self.low is not None and self.high is not None:
                what += f" in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
            elif self.low is not None:
                what += f" {'>' if self.low_open else '>='} {self.low:g}"
        return what + (f", or null ({self.null})" if self.null else "")

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.null is not None
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "name":
            return isinstance(value, str) and value in self.valid_names()
        if self.kind == "names":
            return (isinstance(value, (list, tuple)) and len(value) > 0
                    and all(isinstance(v, str) and v in self.valid_names() for v in value))
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.kind == "int" and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)


def integer(low: int | None = None, null: str | None = None) -> Rule:
    return Rule("int", low=low, null=null)


def number(low: float = 0.0, *, above: bool = False, high: float | None = None, null: str | None = None) -> Rule:
    """A number >= low (> low with above=True), at most `high`."""
    return Rule("number", low=low, low_open=above, high=high, null=null)


POSITIVE = number(0.0, above=True)
NON_NEGATIVE = number(0.0)
PROBABILITY = number(0.0, high=1.0)
FRACTION = Rule("number", low=0.0, high=1.0, low_open=True, high_open=True)  # (0, 1)
SWITCH = Rule("bool")

#: key -> rule; keys that the composed config lacks (another group option) are skipped.
RULES: dict[str, Rule] = {
    "force": SWITCH,
    "jobs": integer(0),
    "seed": integer(0),
    "shard.count": integer(1),
    "shard.index": integer(0),
    "lock.wait_s": NON_NEGATIVE,
    "executor.workers": integer(0),
    "executor.max_retries": integer(0),
    "executor.num_cpus": integer(1, null="all cores"),
    "executor.connect_timeout_s": POSITIVE,
    "executor.in_flight_per_slot": integer(1),
    "budget.max_tasks": integer(1, null="every task"),
    "budget.candidates_per_task": integer(1),
    "sample.strategies": Rule("names", choices="pipeline.stages.sample.STRATEGIES"),
    "sample.timeout_s": number(0.0, above=True, null="no limit"),
    "replay.flush_rows": integer(1),
    "replay.flush_s": POSITIVE,
    "replay.timeout_s": POSITIVE,
    "measure.mode": Rule("name", choices="pipeline.runner.modes.MODES"),
    "measure.bundle_runtime": SWITCH,
    "measure.number": integer(1),
    "measure.repeat": integer(1),
    "measure.rounds": integer(1),
    "measure.min_repeat_ms": NON_NEGATIVE,
    "measure.timeout_s": POSITIVE,
    "measure.check_per_task": integer(0),
    "measure.rtol": NON_NEGATIVE,
    "measure.atol": NON_NEGATIVE,
    "measure.batch_size": integer(1),
    "measure.cache_flush": SWITCH,
    "collect.profiler": Rule("name", choices="features.profilers.PROFILERS"),
    "collect.mode": Rule("name", choices="pipeline.runner.modes.MODES"),
    "bundle.part_mib": integer(1),
    "bundle.part_kernels": integer(1),
    "bundle.ncu_chunk": integer(1),
    "bundle.ncu_timeout_s": POSITIVE,
    "collect.static": SWITCH,
    "collect.cuda_resources": SWITCH,
    "collect.perf.min_time_s": POSITIVE,
    "collect.perf.max_calls": integer(1),
    "collect.perf.timeout_s": POSITIVE,
    "collect.perf.batch_size": integer(1),
    "collect.ncu.batch_size": integer(1),
    "collect.ncu.timeout_s": POSITIVE,
    "collect.ncu.warmup": integer(0),
    "split.test_fraction": FRACTION,
    "split.val_fraction": FRACTION,
    "split.seed": integer(0),
    "split.val_unit": Rule("name", choices="models.splits.VAL_UNITS"),
    "dataset.labels": SWITCH,
    "release.dataset": SWITCH,
    "release.version": integer(1),
    "train.predict_batch": integer(1),
    "train.threads": integer(0),
    "train.topk_min_records": integer(1),
    "train.allow_mixed_hardware": SWITCH,
    "train.same_records": SWITCH,
    "compare.latest_only": SWITCH,
    "tune.max_tasks": integer(1, null="every task"),
    "tune.trials": integer(1),
    "tune.per_iter": integer(1),
    "tune.require_held_out": SWITCH,
    "tune.costmodel.update": SWITCH,
    "tune.costmodel.update_every": integer(1),
    "tune.costmodel.update_rounds": integer(1),
    "tune.costmodel.update_epochs": integer(1),
    "tune.costmodel.update_grades": integer(2),
    "tune.costmodel.update_handover": integer(0),
    "tune.costmodel.update_handover_after": integer(0),
    "tune.xgb_warmup": integer(0),
    "tune.strategy.population_size": integer(1),
    "tune.strategy.init_measured_ratio": PROBABILITY,
    "tune.strategy.init_min_unmeasured": integer(0),
    "tune.strategy.genetic_num_iters": integer(0),
    "tune.strategy.genetic_mutate_prob": PROBABILITY,
    "tune.strategy.genetic_max_fail_count": integer(0),
    "tune.strategy.eps_greedy": PROBABILITY,
    "tune.runner.number": integer(1),
    "tune.runner.repeat": integer(1),
    "tune.runner.min_repeat_ms": NON_NEGATIVE,
    "tune.runner.timeout_s": POSITIVE,
    "tune.runner.cpu_cache_flush": SWITCH,
    "tune.builder_timeout_s": POSITIVE,
    "tune.retime.enabled": SWITCH,
    "tune.retime.rounds": integer(1),
    "tune.retime.number": integer(1),
    "tune.retime.repeat": integer(1),
    "tune.retime.min_repeat_ms": NON_NEGATIVE,
    "tune.reach_tolerance": NON_NEGATIVE,
    "tune.batch": integer(1),
    "tune.bert_layers": integer(1),
    "tune.bert_seq": integer(1),
}


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def _select(cfg, key: str) -> Any:
    return _plain(OmegaConf.select(cfg, key, default=_MISSING, throw_on_resolution_failure=True))


def _shown(value: Any) -> str:
    return "null" if value is None else repr(value) if isinstance(value, str) else str(value)


def _copies_checked_key(cfg, key: str) -> bool:
    """Whether `key` is `${other}` with `other` a key of RULES (reported once, under `other`)."""
    parent, _, last = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if not isinstance(node, DictConfig) or last not in node or not OmegaConf.is_interpolation(node, last):
        return False
    raw = OmegaConf.to_container(node, resolve=False)[last]
    return isinstance(raw, str) and raw.startswith("${") and raw.endswith("}") and raw[2:-1] in RULES


def validate(cfg) -> list[str]:
    """One line per bad setting of `cfg` (empty when every setting is valid)."""
    bad, values = [], {}
    for key, rule in RULES.items():
        if _copies_checked_key(cfg, key):
            continue
        try:
            value = _select(cfg, key)
        except OmegaConfBaseException as e:
            bad.append(f"{key}: cannot be resolved ({str(e).splitlines()[0]})")
            continue
        if value is _MISSING:
            continue
        values[key] = value
        if not rule.accepts(value):
            bad.append(f"{key}={_shown(value)} is not valid: {rule.describe()}")
    seeds = _select(cfg, "tune.seeds") if OmegaConf.select(cfg, "tune") is not None else _MISSING
    if seeds is not _MISSING and not (isinstance(seeds, list) and seeds and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds)):
        bad.append(f"tune.seeds={_shown(seeds)} is not valid: a non-empty list of integers >= 0")
    index, count = values.get("shard.index"), values.get("shard.count")
    if RULES["shard.index"].accepts(index) and RULES["shard.count"].accepts(count) and index >= count:
        bad.append(f"shard.index={index} is not valid: an integer in [0, {count}) with shard.count={count}")
    test, val = values.get("split.test_fraction"), values.get("split.val_fraction")
    if FRACTION.accepts(test) and FRACTION.accepts(val) and test + val >= 1:
        bad.append(f"split.test_fraction={test} + split.val_fraction={val} is not valid: their sum must be "
                   f"< 1 (the rest is the training part)")
    return bad


def check(cfg) -> None:
    """Raise ConfigError (its message: one line per bad setting) unless every setting is valid."""
    bad = validate(cfg)
    if bad:
        raise ConfigError("\n".join(f"bad setting {line}" for line in bad))


# ------------------------------------------------------------ the command line's overrides

GRAMMAR = "https://hydra.cc/docs/1.2/advanced/override_grammar/basic"
# What separates the items of an override's value (lists, dicts, sweeps, functions).
_SEPARATORS = re.compile(r"([,\[\]{}()])")
_LEXER = "LexerNoViableAltException: "


def _readable(parser, override: str) -> bool:
    from hydra.errors import OverrideParseException

    try:
        parser.parse_overrides([override])
        return True
    except OverrideParseException:
        return False


def quoted(override: str) -> str | None:
    """`override` with each item of its value that Hydra cannot read bare put in quotes, if that
    makes it readable (None otherwise): `paths.data=/tmp/dätä` -> `paths.data="/tmp/dätä"`,
    `dataset.ops=[GMM,ä]` -> `dataset.ops=[GMM,"ä"]`. Items, not the whole value, so that a list
    or a sweep stays one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    key, sep, value = override.partition("=")
    if not sep:
        return None
    items = []
    for item in _SEPARATORS.split(value):
        bare = item.strip()
        if not bare or _SEPARATORS.fullmatch(item) or _readable(parser, f"{key}={bare}"):
            items.append(item)
            continue
        mark = '"' if '"' not in bare else "'"
        if mark in bare:
            return None
        lead, trail = item[:len(item) - len(item.lstrip())], item[len(item.rstrip()):]
        items.append(f"{lead}{mark}{bare}{mark}{trail}")
    fixed = f"{key}={''.join(items)}"
    return fixed if fixed != override and _readable(parser, fixed) else None


def _unreadable(override: str, message: str) -> str:
    """One line for an override Hydra's parser refused (its own message spans three lines and
    names no fix)."""
    first, _, rest = message.partition("\n")
    char = ""
    if first.startswith(_LEXER):  # the line under it has a caret at the character it stopped at
        at = rest.split("\n", 1)[0].find("^") - len(_LEXER)
        char = override[at] if 0 <= at < len(override) else ""
    fix = quoted(override)
    if fix is not None:
        what = f"{char!r}" if char else "this value"
        return (f"bad setting {override}: Hydra's override grammar reads {what} only in a quoted value; "
                f"write {shlex.quote(fix)} (the outer quotes are the shell's)")
    reason = f"Hydra's override grammar cannot read {char!r} there" if char else first
    return f"bad setting {override}: {reason} (see {GRAMMAR})"


def override_errors(argv: list[str]) -> list[str]:
    """One line per command-line override (`key=value` of `argv`) that Hydra's parser cannot
    read, naming the fix where quoting makes it readable; read before Hydra starts, which
    would stop with a parser trace and exit code 1."""
    import contextlib
    import io

    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    if any(a in ("--version", "--help", "-h", "--hydra-help") for a in argv):
        return []
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # Hydra reports a bad flag itself
            args, _ = get_args_parser().parse_known_args(argv)
    except SystemExit:
        return []
    parser, out = OverridesParser.create(), []
    for override in args.overrides:
        try:
            parser.parse_overrides([override])
        except OverrideParseException as e:
            out.append(_unreadable(override, e.message))
    return out
