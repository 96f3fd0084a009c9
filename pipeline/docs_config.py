"""The configuration reference, generated from conf/ so that it cannot drift from it.

`python -m pipeline.docs_config > docs/configuration-reference.md` writes the page; a test
compares the committed page with a fresh one. The stages come from `pipeline.stages.STAGES`
and the config groups from Hydra's own config loader, so `python -m pipeline --help` (its
template calls the `pipeline_help` resolver registered here) lists exactly what the page lists.

Every key is read with its default as written in the YAML (interpolations unresolved: the
value depends on the other choices) and the comment block right above it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from omegaconf import OmegaConf

from pipeline import stages

# Hydra's own settings and the defaults list are not options of the pipeline.
SKIPPED_ROOT_KEYS = ("defaults", "hydra")
_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w@.-]*):(?P<value>.*)$")
COMMAND = "python -m pipeline.docs_config > docs/configuration-reference.md"


# ------------------------------------------------------------------ stages and groups

def stage_lines() -> list[str]:
    """One line per stage, from the single list of stages (pipeline.stages.STAGES)."""
    width = max(map(len, stages.STAGES))
    return [f"{name:<{width}}  {what}" + ("  (not run by stage=all)" if name in stages.NOT_IN_ALL else "")
            for name, (_, what) in stages.STAGES.items()]


def hydra_groups() -> tuple[dict[str, list[str]], dict[str, str]]:
    """(group -> options, group -> default choice) as Hydra sees them: the loader of the running
    app (a user's `hydra.searchpath` included) or, outside one, of the project's conf/."""
    from hydra.core.global_hydra import GlobalHydra

    from pipeline import config

    if GlobalHydra.instance().is_initialized():
        return _loader_groups(GlobalHydra.instance().config_loader()), {}
    with config.hydra_context():
        cfg = config.compose_in_context([], hydra_config=True)
        return _loader_groups(GlobalHydra.instance().config_loader()), dict(cfg.hydra.runtime.choices)


def _loader_groups(loader) -> dict[str, list[str]]:
    from hydra.core.object_type import ObjectType

    names = sorted(g for g in loader.list_groups("") if g != "hydra")
    return {g: sorted(loader.get_group_options(g, results_filter=ObjectType.CONFIG)) for g in names}


def group_lines(options: dict[str, list[str]], choices: dict[str, str]) -> list[str]:
    """One line per config group: its options, the chosen (default) one starred."""
    width = max(map(len, options), default=0)
    return [f"{g:<{width}}  " + ", ".join(f"{o}*" if choices.get(g) == o else o for o in opts)
            for g, opts in options.items()]


def help_text(_root_=None) -> str:
    """The stages and config groups of `pipeline --help` (its template's `${pipeline_help:}`);
    `$` doubled, as the template is a string.Template."""
    options, choices = hydra_groups()
    if _root_ is not None:  # the running app's choices, command-line overrides included
        choices = dict(OmegaConf.select(_root_, "hydra.runtime.choices", default={}) or {})
    lines = ["Stages (stage=all, the default, runs them in this order):",
             *("  " + s for s in stage_lines()), "",
             "Config groups (group=option; * = chosen):", *("  " + g for g in group_lines(options, choices))]
    return "\n".join(lines).replace("$", "$$")


OmegaConf.register_new_resolver("pipeline_help", help_text, replace=True)


# ------------------------------------------------------------------ keys and comments

def key_comments(path: Path) -> tuple[str, dict[str, str]]:
    """(the file's header comment, dotted key -> the comment block right above it) of a YAML
    file; a blank line ends a block. The header is the block before the first key when
    that key follows it directly (it describes the file, not the key)."""
    header, comments, pending, stack, skipping = "", {}, [], [], False
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        if not stripped:
            if not comments and pending and not header:
                header = " ".join(pending)
            pending = []
            continue
        m = _KEY_LINE.match(line)
        if m is None or stripped.startswith("-"):
            pending = []
            continue
        indent, key = len(m["indent"]), m["key"]
        if indent == 0:
            skipping = key in SKIPPED_ROOT_KEYS
        if skipping:
            pending = []
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key])
        text = " ".join(pending)
        if not comments and not header and pending and len(pending) == i:  # the file opens with it
            header, text = text, ""
        comments[dotted] = text
        pending = []
        if not m["value"].strip() or m["value"].strip().startswith("#"):
            stack.append((indent, key))
    return header, comments


SECTION = object()  # a mapping's own entry, before its keys


def _leaves(node, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, value as written) of every leaf of a YAML mapping, each mapping preceded by
    (its key, SECTION); an empty mapping is a leaf."""
    out = []
    for k, v in node.items():
        if not prefix and k in SKIPPED_ROOT_KEYS:
            continue
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out += [(key, SECTION), *_leaves(v, key + ".")]
        else:
            out.append((key, v))
    return out


def _shown(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return _flow(value)
    return str(value)


def _flow(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return "{" + ", ".join(f"{k}: {_shown(v)}" for k, v in value.items()) + "}"


def _prose(text: str) -> str:
    """A YAML comment as markdown: `<name>` outside code spans kept as text, not read as HTML."""
    parts = text.split("`")
    return "`".join(p.replace("<", "&lt;") if i % 2 == 0 else p for i, p in enumerate(parts))


def _code(text: str) -> str:
    """`text` as a markdown code span (a longer fence where it holds backticks)."""
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def key_lines(path: Path, prefix: str = "") -> tuple[str, list[str]]:
    """(the file's header comment, one markdown bullet per key: key, default, comment)."""
    header, comments = key_comments(path)
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    bullets = []
    for key, value in _leaves(raw):
        comment = _prose(comments.get(key, ""))
        if value is SECTION:
            bullets += [f"- {_code(prefix + key + '.*')}: {comment}"] if comment else []
        else:
            bullets.append(f"- {_code(prefix + key)} = {_code(_shown(value))}" + (f": {comment}" if comment else ""))
    return header, bullets


def defaults_of(path: Path) -> list[str]:
    """The other configs a group option composes (its defaults list, less _self_)."""
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    out = []
    for item in raw.get("defaults") or []:
        text = item if isinstance(item, str) else ", ".join(f"{k}: {v}" for k, v in item.items())
        if text != "_self_":
            out.append(text)
    return out


# ------------------------------------------------------------------ the page

def reference() -> str:
    """The markdown page docs/configuration-reference.md."""
    from pipeline import config

    options, choices = hydra_groups()
    conf = config.conf_dir()
    out = ["# Configuration reference\n",
           f"Generated from `conf/` by `{COMMAND}` (a test fails when this page differs from "
           "what the command writes); `pipeline --help` prints the same stages and groups. "
           "Defaults are shown as written in the YAML: `${...}` is an interpolation, resolved "
           "when the config is composed. See [Configuration](configuration.md) for how to "
           "select options and override keys.\n",
           "## Stages\n", "| stage | what |", "|---|---|"]
    out += [f"| `{n}` | {what}{' (not run by `stage=all`)' if n in stages.NOT_IN_ALL else ''} |"
            for n, (_, what) in stages.STAGES.items()]
    out += ["", "## Config groups\n", "| group | default | options |", "|---|---|---|"]
    out += [f"| `{g}` | `{choices.get(g, '')}` | {', '.join(f'`{o}`' for o in opts)} |"
            for g, opts in options.items()]
    out += ["", "## Root config (`conf/config.yaml`)\n"]
    out += key_lines(conf / "config.yaml")[1]
    for group, opts in options.items():
        out += ["", f"## Group `{group}`\n"]
        for opt in opts:
            path = conf / group / f"{opt}.yaml"
            header, bullets = key_lines(path, f"{group}.")
            composes = defaults_of(path)
            out += [f"### `{group}={opt}`\n"]
            out += [_prose(header) + "\n"] if header else []
            out += [f"Composes: {', '.join(_code(c) for c in composes)}.\n"] if composes else []
            out += bullets + [""] if bullets else []
    return "\n".join(out).rstrip() + "\n"


# ------------------------------------------------------------------ options the docs mention

_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
_OVERRIDE = re.compile(r"(?<![\w.~/$@-])(?P<plus>\+{0,2})(?P<key>[A-Za-z_]\w*(?:\.[\w@-]+)+)=(?!=)")
_CHOICE = re.compile(r"(?<![\w.~/+-])(?P<group>[a-z_]+)=(?P<option>[\w-]+)")


def mentioned_options(text: str) -> list[tuple[str, dict[str, str]]]:
    """(key, group choices of the same code span or block) of every `key.sub=value` override in
    the code of a markdown text; `+key=` (adds a key) and Hydra's `hydra.*` are left out."""
    out = []
    for chunk in _CODE.findall(text):
        choices = {m["group"]: m["option"] for m in _CHOICE.finditer(chunk)}
        out += [(m["key"], choices) for m in _OVERRIDE.finditer(chunk)
                if not m["plus"] and not m["key"].startswith("hydra.")]
    return out


class _Configs:
    """Composed configs by group choices, each composed once."""

    def __init__(self):
        from pipeline import config

        self.options = hydra_groups()[0]
        self.compose, self.cache = config.compose, {}

    def get(self, choices: dict[str, str]):
        key = tuple(sorted((g, o) for g, o in choices.items() if o in self.options.get(g, ())))
        if key not in self.cache:
            self.cache[key] = self.compose([f"{g}={o}" for g, o in key])
        return self.cache[key]

    def has(self, key: str, choices: dict[str, str]) -> bool:
        """Whether `key` is in the config of these choices or, for a key of a group, of any
        of the group's options (`dataset.release` exists with dataset=release)."""
        group = key.split(".", 1)[0]
        tries = [choices] + [{**choices, group: o} for o in self.options.get(group, ())]
        return any(_has(self.get(c), key) for c in tries)


def _has(cfg, key: str) -> bool:
    parent, _, last = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False) if parent else cfg
    return OmegaConf.is_config(node) and last in node


def unknown_options(paths: list[Path]) -> list[str]:
    """One line per override that a markdown file mentions and no composed config has."""
    configs, out = _Configs(), []
    for path in paths:
        for key, choices in mentioned_options(path.read_text()):
            if not configs.has(key, choices):
                out.append(f"{path.name}: {key}= (with {choices or 'the default choices'})")
    return out


def main() -> None:
    sys.stdout.write(reference())


if __name__ == "__main__":
    main()
