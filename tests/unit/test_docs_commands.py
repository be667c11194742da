"""The README and docs/ say only what is true of the code: every `mwms ...` command line in their shell
blocks names a real command and real options of it, every Python block compiles, every relative link
points at a file that exists, and the README stays a short front door."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer

from mwms.cli.main import app
from mwms_testkit import REPO

REPO = REPO
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
FILES = [README, *DOCS]
README_MAX_LINES = 320

SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
# Blocks of these languages hold output too: only their `$ ` prompt lines are commands.
PROMPT_ONLY_LANGUAGES = {"console", "text"}
FENCE = re.compile(r"^\s*```(\S*)\s*$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "(", ")"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the block's first line of content, 1-based
    language: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class CommandLine:
    path: Path
    line: int
    text: str

    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}: {self.text!r}"


def blocks(path: Path) -> Iterator[Block]:
    """The fenced code blocks of a markdown file."""
    language: str | None = None
    start = 0
    content: list[str] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        fence = FENCE.match(line)
        if language is None:
            if fence:
                language, start, content = fence.group(1).lower(), number + 1, []
        elif fence and not fence.group(1):
            yield Block(path, start, language, tuple(content))
            language = None
        else:
            content.append(line)
    assert language is None, f"{path.relative_to(REPO)}:{start - 1}: a code block is never closed"


def command_lines(block: Block) -> Iterator[CommandLine]:
    """Lines that run `mwms ...` in a shell block: a leading `$ ` prompt and `VAR=value ` assignments
    stripped, backslash continuations joined."""
    prompt_only = block.language in PROMPT_ONLY_LANGUAGES
    if block.language not in SHELL_LANGUAGES | PROMPT_ONLY_LANGUAGES:
        if block.language or not any(line.lstrip().startswith(("mwms ", "$ mwms ")) for line in block.lines):
            return
    index = 0
    while index < len(block.lines):
        first = index
        text = block.lines[index].strip()
        while text.endswith("\\") and index + 1 < len(block.lines):
            index += 1
            text = text[:-1].rstrip() + " " + block.lines[index].strip()
        index += 1
        if text.startswith("$ "):
            text = text[2:].lstrip()
        elif prompt_only:
            continue
        words = text.split()
        while words and ASSIGNMENT.match(words[0]):
            if words[0].endswith("=$(mwms"):  # JOB=$(mwms submit ...): the command substituted is checked
                words[0] = "mwms"
                break
            words.pop(0)
        if words and words[0] == "sudo":
            words.pop(0)
        if len(words) > 1 and words[0] == "mwms":
            yield CommandLine(block.path, block.line + first, " ".join(words))


def words_of(command: CommandLine) -> list[str]:
    """The command's words up to the end of its first command (a pipe, `&&`, a redirection, a comment)."""
    lexer = shlex.shlex(command.text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    try:
        for word in lexer:
            if word in SEPARATORS or set(word) <= set("|&;<>()"):
                break
            words.append(word)
    except ValueError as error:  # an unbalanced quote
        pytest.fail(f"{command.where()}: cannot be split as a shell line: {error}")
    return words


# Typer builds its commands with a click of its own (typer._click), so commands, groups and options are
# told apart by what they have, not by click's classes.
def context(command: Any) -> Any:
    return command.context_class(command)


def options_of(command: Any) -> dict[str, Any]:
    """Every spelling of every option of `command` (`--help` included), to its click parameter."""
    found: dict[str, Any] = {}
    for param in command.get_params(context(command)):
        if param.param_type_name == "option":
            for name in (*param.opts, *param.secondary_opts):
                found[name] = param
    return found


def problems_of(command: CommandLine, root: Any) -> list[str]:
    """What is wrong with one `mwms ...` line: an unknown command or an option its command lacks."""
    words = words_of(command)
    assert words and words[0] == "mwms", command.where()
    current, path = root, ["mwms"]
    options = options_of(current)
    problems: list[str] = []
    expects_value = False
    for word in words[1:]:
        if expects_value:
            expects_value = False
            continue
        if word == "--":
            break  # the program's own arguments follow
        if word.startswith("-") and word != "-" and not re.fullmatch(r"-\d.*", word):
            name = word.split("=", 1)[0]
            if name.startswith("--") or len(name) == 2:
                param = options.get(name)
                if param is None:
                    problems.append(f"`{' '.join(path)}` has no option {name}")
                elif not param.is_flag and not param.count and "=" not in word:
                    expects_value = True
            continue
        if hasattr(current, "list_commands"):  # a group
            sub = current.get_command(context(current), word)
            if sub is not None:
                current, path = sub, [*path, word]
                options = options_of(current)
                continue
            if current is root or not current.invoke_without_command:
                problems.append(f"`{' '.join(path)}` has no command {word!r}")
                break
    return problems


def all_command_lines() -> list[CommandLine]:
    return [command for path in FILES for block in blocks(path) for command in command_lines(block)]


def test_the_docs_exist_and_hold_commands() -> None:
    assert README.is_file() and DOCS, "README.md and docs/*.md"
    assert len(all_command_lines()) >= 20, "the extraction of `mwms ...` lines found almost nothing"


def test_every_mwms_command_line_names_a_real_command_and_its_options() -> None:
    root = typer.main.get_command(app)
    problems = [
        f"{command.where()}: {problem}"
        for command in all_command_lines()
        for problem in problems_of(command, root)
    ]
    assert not problems, "\n".join(problems)


def test_the_checker_catches_what_it_is_meant_to() -> None:
    root = typer.main.get_command(app)

    def check(text: str) -> list[str]:
        return problems_of(CommandLine(README, 1, text), root)

    assert check("mwms submit . --workers 2 --wait -- python train.py --not-an-mwms-option") == []
    assert check("mwms agent --server h:50051 --slots 2 --join-token-file f") == []
    assert check("mwms agent drain gpu-1 --grace 30s --wait") == []
    assert check("mwms server --systemd-unit | sudo tee x --bogus") == []
    assert check("mwms submit . --workerz 2 -- python train.py") == ["`mwms submit` has no option --workerz"]
    assert check("mwms frobnicate JOB") == ["`mwms` has no command 'frobnicate'"]
    assert check("mwms token mint --user u") == ["`mwms token` has no command 'mint'"]


def test_every_python_block_compiles() -> None:
    problems = []
    for path in FILES:
        for block in blocks(path):
            if block.language not in {"python", "py"}:
                continue
            try:
                compile("\n".join(block.lines) + "\n", f"{path.name}:{block.line}", "exec")
            except SyntaxError as error:
                line = block.line + (error.lineno or 1) - 1
                problems.append(
                    f"{path.relative_to(REPO)}:{line}: python block does not compile: {error.msg}"
                )
    assert not problems, "\n".join(problems)


def test_every_relative_link_points_at_a_file() -> None:
    problems = []
    for path in FILES:
        in_block = False
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if FENCE.match(line):
                in_block = not in_block
                continue
            if in_block:
                continue
            for target in LINK.findall(line):
                if target.startswith(("http://", "https://", "#", "mailto:")):
                    continue
                file = target.split("#", 1)[0]
                if not (path.parent / file).exists():
                    problems.append(f"{path.relative_to(REPO)}:{number}: link to {target!r}: no such file")
    assert not problems, "\n".join(problems)


def test_the_readme_is_a_front_door() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, more than {README_MAX_LINES}: move detail into docs/"
    )
