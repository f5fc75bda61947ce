"""The README as a script: every command under "Using it" runs as written (issue 13).

The commands run in order, in one bash process, from a fresh working directory laid out
like the repository: ``data``, ``models`` and ``.venv`` link to this checkout's (read
only), ``examples`` is a copy (job specs resolve their paths against their own file) and
``runs/`` starts empty. PATH does not hold the virtualenv, so the README's own
``. .venv/bin/activate`` is what puts ``elmo`` on it. The "Set up" block (``make run``,
``make test``) is how a user gets there and is what runs this test, so it is not rerun.

Only lines naming ``s3://`` or ``--device cuda`` are left out; each kind has a test of its
own (S3 through moto; the fail-fast path without a GPU), which this module checks exists.
The ``python`` block is a doctest run afterwards in the same directory, so its printed
outputs are checked too.
"""

from __future__ import annotations

import doctest
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

README = REPO / "README.md"
SCRIPT_SECTION = "## Using it"
# A line with one of these needs a bucket or a GPU -> the test file that covers it.
SKIPPED_KINDS = {"s3://": "S3 through moto", "--device cuda": "the fail-fast path without a GPU"}

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def code_blocks(markdown: str) -> list[tuple[str, str]]:
    """(language, body) of the fenced blocks after the "Using it" heading."""
    section = markdown[markdown.index(SCRIPT_SECTION):]
    return [(m.group(1), m.group(2)) for m in _FENCE.finditer(section)]


def shell_commands(markdown: str) -> list[str]:
    """The commands of the ``sh`` blocks, continuation lines joined, blank lines dropped."""
    commands: list[str] = []
    for language, body in code_blocks(markdown):
        if language != "sh":
            continue
        pending = ""
        for line in body.splitlines():
            pending += line
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            if pending.strip():
                commands.append(pending.strip())
            pending = ""
    return commands


def skipped_kind(command: str) -> str | None:
    return next((kind for kind in SKIPPED_KINDS if kind in command), None)


def _workspace(root: Path) -> Path:
    activate = Path(sys.prefix) / "bin" / "activate"
    assert activate.is_file(), f"run the tests from the project's virtualenv (make test); " \
                               f"{activate} does not exist"
    work = root / "clone"
    work.mkdir()
    for name in ("data", "models"):
        (work / name).symlink_to(REPO / name, target_is_directory=True)
    (work / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    shutil.copytree(REPO / "examples", work / "examples")
    return work


def _script(commands: list[str]) -> str:
    lines = ["set -eo pipefail",
             "trap 'echo \"README command failed (exit $?): $BASH_COMMAND\" >&2' ERR"]
    for command in commands:
        lines.append(f"printf '%s\\n' {_quote('$ ' + command)}")
        lines.append(command)
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def _environment() -> dict[str, str]:
    """The user's environment minus this virtualenv on PATH (activation must put it there)."""
    venv_bin = str(Path(sys.prefix) / "bin")
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "ELMO_INDEX", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and Path(p) != Path(venv_bin))
    env["RAY_AUTH_MODE"] = "disabled"
    return env


@pytest.mark.slow
def test_readme_commands_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    markdown = README.read_text(encoding="utf-8")
    commands = [c for c in shell_commands(markdown) if skipped_kind(c) is None]
    assert commands[0] == ". .venv/bin/activate"
    assert len(commands) >= 20
    work = _workspace(tmp_path)
    result = subprocess.run(["bash", "-c", _script(commands)], cwd=work, env=_environment(),
                            capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "Traceback" not in output, output[-6000:]
    # Every command ran, and a few of them did what the README says.
    assert result.stdout.count("\n$ ") + result.stdout.startswith("$ ") == len(commands)
    assert (work / "runs" / "example" / "_dataset.json").is_file()
    assert (work / "runs" / "play.png").stat().st_size > 1000
    assert "<html" in (work / "runs" / "play.html").read_text(encoding="utf-8").lower()
    assert re.search(r"^  pos: weights \[", result.stdout, re.MULTILINE), output[-3000:]
    assert re.search(r"^example: not due \(last run .* \(no-changes\)\); next due ",
                     result.stdout, re.MULTILINE), output[-3000:]
    assert (work / "runs" / "tiny-model" / "weights.safetensors").is_file()

    # The Python block, as a doctest, in the directory the commands left behind.
    (python,) = [body for language, body in code_blocks(markdown) if language == "python"]
    monkeypatch.chdir(work)
    test = doctest.DocTestParser().get_doctest(python, {}, "README.md", str(README), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


def test_only_bucket_and_gpu_lines_are_left_out_and_each_has_its_own_test() -> None:
    commands = shell_commands(README.read_text(encoding="utf-8"))
    skipped = {kind: [c for c in commands if skipped_kind(c) == kind] for kind in SKIPPED_KINDS}
    assert all(skipped.values()), skipped  # the README shows both
    tests = {path.name: path.read_text(encoding="utf-8")
             for path in (REPO / "tests").rglob("test_*.py") if path.name != "test_readme.py"}
    s3 = [name for name, text in tests.items() if "moto" in text and "s3://" in text]
    assert s3, "no test runs S3 through moto"
    gpu = [name for name, text in tests.items() if re.search(r'"--device",\s*"cuda"', text)]
    assert gpu, "no test runs `--device cuda` (the fail-fast path without a GPU)"


def test_readme_needs_nothing_outside_the_repository() -> None:
    markdown = README.read_text(encoding="utf-8")
    assert "../shared" not in markdown and "/shared/" not in markdown
    # Every repository path a command names exists in a fresh clone (runs/ is made by them).
    for command in shell_commands(markdown):
        for path in re.findall(r"(?<![\w/.])((?:data|models|examples)/[\w./*-]+)", command):
            matches = list(REPO.glob(path.rstrip("/")))
            assert matches, f"{path} (in: {command}) does not exist"
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^run:", makefile, re.MULTILINE)
    assert re.search(r"^test:", makefile, re.MULTILINE)
