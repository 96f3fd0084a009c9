"""The documentation against the code: the generated configuration reference, the options the
pages mention, `pipeline --help`, the mkdocs site, and the figures the README quotes from the
table of every check on networks never measured."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import docs_config, stages

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "configuration-reference.md"
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def test_reference_page_is_what_conf_generates():
    assert REFERENCE.read_text() == docs_config.reference(), \
        f"docs/configuration-reference.md is out of date with conf/: run `{docs_config.COMMAND}`"


def test_reference_lists_every_key_with_its_default_and_comment():
    text = REFERENCE.read_text()
    assert "- `tune.trials` = `${oc.select:budget.tune_trials,16}`: Trials per task" in text
    assert "- `measure.repeat` = `3`" in text
    assert "### `dataset=release`" in text and "- `dataset.release` = `null`" in text
    assert "- `hydra." not in text and "defaults" not in re.findall(r"- `(\w+)", text)


def test_pages_mention_only_options_that_exist():
    mentioned = [k for p in PAGES for k, _ in docs_config.mentioned_options(p.read_text())]
    assert "tune.seeds" in mentioned and "dataset.release" in mentioned  # the scan reads the pages
    assert docs_config.unknown_options(PAGES) == []


def test_a_made_up_option_is_reported(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Run `pipeline tune.trialz=8 +extra.key=1 hydra.run.dir=x` and\n\n"
                    "```bash\npipeline dataset=release dataset.release=foo model.lgbm.params.num_leaves=63\n```\n")
    assert docs_config.unknown_options([page]) == ["page.md: tune.trialz= (with the default choices)"]


def _listed(text: str, heading: str) -> list[str]:
    """The first word of each indented line under `heading` of the --help text."""
    block = text.split(heading, 1)[1].split("\n\n", 1)[0]
    return [line.split()[0] for line in block.splitlines()[1:] if line.startswith("  ")]


def test_help_lists_the_stages_and_groups_of_the_reference():
    out = subprocess.run([sys.executable, "-m", "pipeline", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert _listed(out, "Stages (") == list(stages.STAGES)
    groups = {line.split()[0]: line.split(None, 1)[1].replace("*", "").split(", ")
              for line in out.split("Config groups (", 1)[1].split("\n\n", 1)[0].splitlines()[1:]}
    text = REFERENCE.read_text()
    page_groups = {m[1]: re.findall(r"`([^`]+)`", m[3]) for m in re.finditer(r"^\| `(\w+)` \| `(\w*)` \| (.*) \|$",
                                                                               text, re.M)}
    page_stages = re.findall(r"^\| `(\w+)` \| [^`|]", text.split("## Config groups")[0], re.M)
    assert groups == page_groups and page_stages == list(stages.STAGES)
    assert "model     all*," in out  # the default choice is marked


def test_help_marks_the_choices_of_the_command_line():
    out = subprocess.run([sys.executable, "-m", "pipeline", "--help", "budget=smoke"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "budget    default, full, smoke*, transfer" in out


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the `docs` extra)")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "configuration-reference" / "index.html").is_file()


def test_the_groups_table_of_the_configuration_page_names_every_option():
    """The hand-written table names each group's options, or links to the generated list."""
    reference = {group: set(options) for group, options in docs_config.hydra_groups()[0].items()}
    table = (ROOT / "docs" / "configuration.md").read_text().split("| group | options | what |", 1)[1].split("\n\n")[0]
    rows = re.findall(r"^\| `(\w+)` \| (.*?) \| .* \|$", table, re.M)
    assert {"dataset", "model", "split", "executor"} <= {group for group, _ in rows}
    for group, options in rows:
        named = set(re.findall(r"`([^`]+)`", options))
        assert named <= reference[group], f"docs/configuration.md names options `{group}` lacks: {named - reference[group]}"
        assert named == reference[group] or "configuration-reference.md#config-groups" in options, \
            f"docs/configuration.md's `{group}` row misses {sorted(reference[group] - named)}"


WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                    "fourteen fifteen sixteen seventeen eighteen nineteen".split())}
WORDS.update({w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty".split()) if i > 1})


def number(words: str) -> int:
    """'thirty-one' -> 31 (the counts the pages spell out)."""
    return sum(WORDS[w] for w in words.split("-"))


def test_the_figures_quoted_from_the_table_of_every_check_are_the_ledgers():
    """The counts, the means over every network and the figures with the network as the unit
    that the README and docs/models.md quote are those the ledger of every check gives
    (models/checks.py; its table in docs/models.md is tested against it in test_checks)."""
    from models import checks

    t = checks.tally(checks.read())
    text = (ROOT / "docs" / "models.md").read_text()
    section = " ".join(text.split("## Networks never measured: every check in one table", 1)[1]
                       .split("\n## ")[0].split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = re.search(r"\(([a-z-]+) checks, .*? on ([a-z-]+) networks of ([a-z-]+), .*? mean top-1 ([\d.]+) against "
                     r"([\d.]+) \(random pick ([\d.]+)\), with the network as the unit \+([\d.]+) \[\+([\d.]+), "
                     r"\+([\d.]+)\]", readme)
    assert said, "README: the sentence on networks never measured no longer reads as this test expects"
    assert (number(said[1]), number(said[2]), number(said[3])) == (t["checks"], t["ahead"], t["networks"])
    assert list(said.groups()[3:6]) == [f"{t[k]:.3f}" for k in ("model", "ms_xgb", "random")]
    assert list(said.groups()[6:9]) == [f"{t[k]:.3f}" for k in ("mean_diff", "lo", "hi")]
    assert f"[+{t['lo']:.3f}, +{t['hi']:.3f}]" in section and f"p = {t['p']:.3f}" in section
