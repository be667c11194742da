"""Rewrites references to the coordinator and agent packages into the `mwms` namespace, in place.

The folders stay where they are (server/, worker_agent/ at the top of the repository); the distribution
installs them as `mwms.server` and `mwms.worker_agent` (mwms/server and mwms/worker_agent are links to
them), so no generic top-level name lands in anyone's site-packages. This script rewrites what names them
as Python modules:

- import statements: `from server.x import y`, `from server import x`, `import server.x as y`;
- dotted module names (strings, comments, docs, pyproject contracts, monkeypatch targets):
  `server.<child>` where <child> is a module or package that exists in server/ (read from the tree,
  so `server.url` or a file name such as `server.env` is left alone); in Python code outside strings and
  comments only where the file binds the name by `import server.x` (else `server.app` is a variable's);
- `-m server...` / `"-m", "worker_agent..."` in command lines.

It is idempotent (`mwms.server.x` is never rewritten again), so it can be rerun on a tree that others
have changed since. Afterwards it sorts the imports (`ruff check --select I --fix`) and runs `ruff format`
on the Python files it changed, since the longer names move imports between groups and past the line length.

Usage, from the repository root:  .venv/bin/python scripts/rename_namespace.py [--dry-run] [PATH ...]
With no PATH it rewrites every file git tracks or would track (untracked but not ignored).
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("server", "worker_agent")
NAMESPACE = "mwms"
TEXT_SUFFIXES = {".py", ".pyi", ".toml", ".md", ".cfg", ".ini", ".sh", ".yml", ".yaml", ".txt", ".service"}
TEXT_NAMES = {"Makefile", "Dockerfile", "run"}  # .ci/run
SKIPPED_PREFIXES = (
    "web/vendor/",
    "mwms/v1/",
    "scripts/rename_namespace.py",
    "mwms/server/",
    "mwms/worker_agent/",
)
# mwms/server and mwms/worker_agent are links to the folders themselves: each file is rewritten once, there.


def children(package: str) -> list[str]:
    """The modules and subpackages directly inside server/ or worker_agent/ of this tree."""
    folder = ROOT / package
    names = {path.stem for path in folder.glob("*.py") if path.stem not in {"__init__", "__main__"}}
    names |= {path.parent.name for path in folder.glob("*/__init__.py")}
    return sorted(names, key=len, reverse=True)


Rules = list[tuple[re.Pattern[str], str]]


def build_rules() -> tuple[Rules, Rules]:
    """(rules for import statements and `-m`, rules for dotted module names)."""
    packages = "|".join(PACKAGES)
    statements: Rules = [
        # from server import x / from server.x import y (also inside `python -c` code in a string)
        (re.compile(rf"(?<![\w.])(from\s+)({packages})(?=(?:\.\w+)*\s+import\b)"), rf"\1{NAMESPACE}.\2"),
        # import server.x [as y], as a statement of its own line
        (
            re.compile(rf"^(\s*import\s+)({packages})(?=(?:\.\w+)*(?:\s+as\s+\w+)?\s*(?:#.*)?$)", re.M),
            rf"\1{NAMESPACE}.\2",
        ),
        # python -m server.main / "-m", "worker_agent.x"
        (re.compile(rf"(-m(?:['\"],)?\s*['\"]?)({packages})\b(?=[.'\"\s]|$)", re.M), rf"\1{NAMESPACE}.\2"),
    ]
    dotted: Rules = []
    for package in PACKAGES:
        names = "|".join(re.escape(name) for name in children(package))
        if names:
            # not after a word character, a dot, a slash or a hyphen: mwms.server.x, self.server.app,
            # deploy/server.env and mwms-server.service stay as they are
            pattern = re.compile(rf"(?<![\w./-])({package})\.({names})\b(?!-)")
            dotted.append((pattern, rf"{NAMESPACE}.\1.\2"))
    return statements, dotted


# `import server.db.models` binds the name `server`: then code says server.db.models.X, and that is rewritten too.
BINDING_IMPORT = re.compile(rf"^\s*import\s+({'|'.join(PACKAGES)})(?:\.\w+)*\s*(?:#.*)?$", re.M)


def candidate_files(paths: list[str]) -> list[Path]:
    if paths:
        listed = paths
    else:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    files = []
    for name in listed:
        path = ROOT / name
        relative = path.relative_to(ROOT).as_posix() if path.is_absolute() else name
        if relative.startswith(SKIPPED_PREFIXES) or path.is_symlink() or not path.is_file():
            continue
        if path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES or path.name.endswith(".env.example"):
            files.append(path)
    return files


def apply(text: str, rules: Rules) -> str:
    for pattern, replacement in rules:
        text = pattern.sub(replacement, text)
    return text


def text_spans(source: str) -> list[tuple[int, int]] | None:
    """(start, end) offsets of the strings and comments of Python source; None if it does not tokenize."""
    line_starts = [0]
    for line in source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    spans = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type in (tokenize.STRING, tokenize.COMMENT):
                (start_row, start_col), (end_row, end_col) = token.start, token.end
                spans.append((line_starts[start_row - 1] + start_col, line_starts[end_row - 1] + end_col))
    except (tokenize.TokenError, SyntaxError):
        return None
    return spans


def rewrite_literal(token: str, dotted: Rules) -> str:
    """A string or comment token rewritten; an f-string's {fields} are code and stay as they are."""
    prefix = token[: len(token) - len(token.lstrip("rRbBuUfF"))]
    if "f" not in prefix.lower():
        return apply(token, dotted)
    pieces, literal, depth, index = [], "", 0, 0
    while index < len(token):
        pair = token[index : index + 2]
        if depth == 0 and pair in ("{{", "}}"):
            literal += pair
            index += 2
            continue
        character = token[index]
        if character == "{":
            if depth == 0:
                pieces.append(apply(literal, dotted))
                literal = ""
            depth += 1
        if depth:
            pieces.append(character)
        else:
            literal += character
        if character == "}" and depth:
            depth -= 1
        index += 1
    pieces.append(apply(literal, dotted))
    return "".join(pieces)


def rewrite(path: Path, text: str, rules: tuple[Rules, Rules]) -> str:
    """The text with the packages renamed. In Python code a dotted `server.<child>` outside strings and
    comments is a variable's attribute (server.app of a test's coordinator), unless the file binds the
    name with `import server...`."""
    statements, dotted = rules
    if path.suffix not in {".py", ".pyi"} or BINDING_IMPORT.search(text):
        return apply(apply(text, statements), dotted)
    spans = text_spans(text)
    if spans is None:
        print(f"{path}: does not tokenize; only its import statements were rewritten", file=sys.stderr)
        return apply(text, statements)
    pieces, done = [], 0
    for start, end in spans:
        pieces += [text[done:start], rewrite_literal(text[start:end], dotted)]
        done = end
    pieces.append(text[done:])
    return apply("".join(pieces), statements)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="Files to rewrite (default: every file git knows of).")
    parser.add_argument(
        "--dry-run", action="store_true", help="Print the files that would change, change none."
    )
    args = parser.parse_args()
    rules = build_rules()
    changed: list[Path] = []
    for path in candidate_files(args.paths):
        try:
            before = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        after = rewrite(path, before, rules)
        if after != before:
            changed.append(path)
            if not args.dry_run:
                path.write_text(after, encoding="utf-8")
    for path in changed:
        print(path.relative_to(ROOT))
    python_files = [str(path) for path in changed if path.suffix in {".py", ".pyi"}]
    if python_files and not args.dry_run:
        ruff = Path(sys.executable).with_name("ruff")
        command = [str(ruff)] if ruff.exists() else [sys.executable, "-m", "ruff"]
        subprocess.run([*command, "check", "--quiet", "--select", "I", "--fix", *python_files], cwd=ROOT)
        subprocess.run([*command, "format", "--quiet", *python_files], cwd=ROOT, check=True)
    print(f"{len(changed)} files {'would change' if args.dry_run else 'rewritten'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
