"""`elmo COMMAND --help` teaches: every verb has a description and examples, and every
option and positional says what it is for (issue 13). In-process, through the parser
objects, so walking every verb takes well under a second."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from pipeline.cli import build_parser


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)),
                None)


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
         ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(``elmo VERB ...``, parser) for the top level and every verb below it."""
    yield " ".join(("elmo", *path)), parser
    verbs = _subparsers(parser)
    if verbs is not None:
        for name, child in verbs.choices.items():
            yield from walk(child, (*path, name))


PARSERS = dict(walk(build_parser()))


def test_every_verb_is_walked() -> None:
    expected = {"elmo train", "elmo model info", "elmo model export", "elmo model package",
                "elmo embed-sentences", "elmo embed", "elmo sql", "elmo index build",
                "elmo index info", "elmo senses search", "elmo senses cluster",
                "elmo senses change", "elmo senses label",
                "elmo mix list", "elmo mix fit", "elmo jobs validate", "elmo jobs run",
                "elmo jobs schedule", "elmo jobs status", "elmo jobs submit", "elmo demo",
                "elmo pool", "elmo search passages"}
    assert expected <= set(PARSERS)


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_verb_has_a_description_and_examples(command: str) -> None:
    parser = PARSERS[command]
    assert (parser.description or "").strip(), f"`{command} --help` has no description"
    text = parser.format_help()
    heading = re.search(r"^examples?\b[^\n]*:$", text, re.MULTILINE)
    assert heading, f"`{command} --help` has no examples"
    examples = text[heading.start():]
    assert f"\n  {command}" in examples or f"\n  {command.split()[0]} " in examples, \
        f"`{command} --help`: the examples do not show the command"
    assert "``" not in text and ":func:" not in text, f"`{command} --help` shows raw markup"


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_option_and_positional_has_help(command: str) -> None:
    parser = PARSERS[command]
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._SubParsersAction):
            missing += [f"verb {choice.dest}" for choice in action._choices_actions
                        if not (choice.help or "").strip()]
            continue
        if not (action.help or "").strip():
            missing.append("/".join(action.option_strings) or action.metavar or action.dest)
    assert not missing, f"`{command} --help`: no help for {', '.join(map(str, missing))}"


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path) -> None:
    """`elmo sql ... | head -1`: the CLI stops quietly when its reader goes away."""
    import subprocess
    import sys

    from helpers import REPO
    from synthetic_dataset import write_synthetic

    write_synthetic(tmp_path / "ds", 200, 8, n_shards=1, vocab=20)
    command = [sys.executable, "-m", "pipeline.cli", "sql", str(tmp_path / "ds"),
               "select * from range(300000)", "--format", "csv", "--no-verify"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd=REPO) as process:
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.readline().strip() == b"range"
        process.stdout.close()  # as `head -1` does
        error = process.stderr.read().decode()
        assert process.wait(timeout=60) == 141
    assert "Traceback" not in error and error == ""


def test_embed_help_names_the_default_storage_dtype_everywhere() -> None:
    """The options list and the "Output" paragraph name the same default (issue 38)."""
    from pipeline.write.config import EmbedConfig

    default = EmbedConfig.__dataclass_fields__["dtype"].default
    text = " ".join(PARSERS["elmo embed"].format_help().split())
    assert f"storage dtype of the layers (default {default})" in text
    output = text[text.index("Output:"):]
    assert f"layers stored as {default} by default" in output and "float16 layers" not in output
