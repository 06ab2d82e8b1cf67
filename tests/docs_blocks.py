"""The code blocks of README.md and docs/*.md, and the checks every block must pass.

A fenced block names its language (bash, python, json, toml or text). A bash or python
block is run against a real server by tests/e2e/test_docs.py unless the line before it is
`<!-- doc-test: no-run (why) -->`; every block is checked statically by
tests/unit/test_docs.py. The README's opening indented block (the two commands) is the one
indented block allowed, and is never run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

from rofu import cli

ROOT = Path(__file__).resolve().parents[1]
LANGUAGES = ("bash", "python", "json", "toml", "text")
RUNNABLE = ("bash", "python")
NO_RUN = re.compile(r"^<!-- doc-test: no-run \((?P<why>[^)]+)\) -->$")
FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")
#: harness command -> (module, function) building the parser that takes its arguments
HARNESS_PARSERS = {
    "replay": ("rofu.replay.arguments", "build_parser"),
    "ope": ("rofu.replay.ope_cli", "build_ope_parser"),
    "evaluate": ("rofu.evaluation.evaluate", "build_parser"),
}
#: shell words that start a command without being one
SHELL_KEYWORDS = ("do", "then", "else", "time", "exec", "!")


@dataclass(frozen=True)
class Block:
    """One code block: where it is, its language, its text and why it is not run."""

    path: Path
    line: int  # 1-based line of its first line of code
    lang: str
    text: str
    no_run: str | None = None  # the reason, when it is not run

    @property
    def where(self) -> str:
        """`docs/api.md:42`, for messages and test ids."""
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        """Whether tests/e2e/test_docs.py runs it."""
        return self.lang in RUNNABLE and self.no_run is None


def doc_files() -> list[Path]:
    """README.md, then docs/*.md in name order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks_of(path: Path, text: str | None = None) -> list[Block]:
    """Every code block of a Markdown file; an unclosed fence or an unknown language raises."""
    lines = (path.read_text() if text is None else text).splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j] == "```"), None)
            if end is None:
                raise ValueError(f"{path}:{i + 1}: a code fence is never closed")
            lang = fence["lang"]
            if lang not in LANGUAGES:
                raise ValueError(f"{path}:{i + 1}: code block language {lang!r} not in {LANGUAGES}")
            marker = NO_RUN.match(lines[i - 1]) if i > 0 else None
            body = "\n".join(lines[i + 1 : end]) + "\n"
            found.append(Block(path, i + 2, lang, body, marker["why"] if marker else None))
            i = end + 1
        elif _starts_indented_block(lines, i):
            end = i
            while end < len(lines) and lines[end].startswith("    "):
                end += 1
            body = "\n".join(line[4:] for line in lines[i:end]) + "\n"
            found.append(Block(path, i + 1, "bash", body, "an indented block: the two commands"))
            i = end
        else:
            i += 1
    return found


def _starts_indented_block(lines: list[str], i: int) -> bool:
    """A 4-space line after a blank line that follows a paragraph, not a list item."""
    if not lines[i].startswith("    ") or i == 0 or lines[i - 1].strip():
        return False
    before = next((line for line in reversed(lines[:i]) if line.strip()), "")
    return not re.match(r"^(\s|[-*] |\d+\. |\|)", before)


def all_blocks() -> list[Block]:
    """The blocks of every documentation file, in reading order."""
    return [block for path in doc_files() for block in blocks_of(path)]


def no_run_markers_without_block(path: Path) -> list[int]:
    """Lines of `no-run` markers that do not stand right before a bash or python block."""
    lines = path.read_text().splitlines()
    return [
        i + 1
        for i, line in enumerate(lines)
        if line.startswith("<!-- doc-test")
        and not (
            NO_RUN.match(line)
            and i + 1 < len(lines)
            and FENCE.match(lines[i + 1])
            and FENCE.match(lines[i + 1])["lang"] in RUNNABLE  # type: ignore[index]
        )
    ]


def shell_commands(script: str) -> Iterator[list[str]]:
    """The simple commands of a shell script as words (comments, `\\` joins, operators,
    `VAR=value` prefixes and keywords such as `do` removed)."""
    lexer = shlex.shlex(_one_line(script), posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = ""
    words: list[str] = []
    for token in [*lexer, ";"]:
        if token and set(token) <= set(";&|()<>"):
            yield from _command(words)
            words = []
        else:
            words.append(token)


def _one_line(script: str) -> str:
    """The script with its comments dropped and every command ended by `;` (quotes kept)."""
    out: list[str] = []
    quote, i = "", 0
    while i < len(script):
        char = script[i]
        if char == "\\" and quote != "'":
            pair = script[i : i + 2]
            out.append(" " if pair == "\\\n" else pair)
            i += 2
            continue
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (not out or out[-1][-1] in " \t;"):
            while i < len(script) and script[i] != "\n":
                i += 1
            continue
        elif char == "\n":
            char = " ; "
        out.append(char)
        i += 1
    return "".join(out)


def _command(words: list[str]) -> Iterator[list[str]]:
    while words and (words[0] in SHELL_KEYWORDS or re.match(r"^\w+=", words[0])):
        words = words[1:]
    if words:
        yield words


def rofu_parse_error(args: list[str]) -> str | None:
    """Why the real `rofu` parsers refuse `rofu <args>`, or None when they accept it."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            _parse_rofu(args)
    except SystemExit as exited:
        if isinstance(exited.code, str):
            return exited.code
        if exited.code not in (0, None):
            lines = stderr.getvalue().strip().splitlines()
            return lines[-1] if lines else f"exit {exited.code}"
    return None


def _parse_rofu(args: list[str]) -> None:
    parsed, rest = cli.build_parser().parse_known_args(args)
    parser: argparse.ArgumentParser | None = None
    if parsed.command == "bench":
        if parsed.which is None:
            raise SystemExit("rofu bench: no benchmark named")
        parser = import_module(cli.BENCHMARKS[parsed.which][0]).build_parser()
    elif parsed.command in HARNESS_PARSERS:
        module, function = HARNESS_PARSERS[parsed.command]
        parser = getattr(import_module(module), function)()
    if parser is not None:
        parser.parse_args(rest)
    elif rest:
        raise SystemExit(f"rofu {parsed.command}: unrecognised arguments: {' '.join(rest)}")


def bash_syntax_error(script: str) -> str | None:
    """`bash -n`'s complaint about a script, or None."""
    result = subprocess.run(
        ["bash", "-n"], input=script, capture_output=True, text=True, check=False
    )
    if result.returncode == 0:
        return None
    return result.stderr.strip() or f"bash -n exited {result.returncode}"
