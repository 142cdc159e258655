"""``kl help [TOPIC]``: a man page, through ``man`` where it is installed, else as plain
text rendered here from the roff source (no groff or mandoc needed).

The pages are looked for in this checkout's ``man/`` (an editable install: edits show at
once), then where ``pip install`` puts them: ``<prefix>/share/man/manN``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import click

SECTIONS = ("1", "3", "5", "7")
WIDTH = 80
INDENT = 7
"""Where man puts a page's text: its paragraphs, and the tags of its tagged paragraphs."""

_GLYPHS = {
    "aq": "'",
    "dq": '"',
    "lq": "\u201c",
    "rq": "\u201d",
    "bu": "\u2022",
    "em": "\u2014",
    "en": "\u2013",
    "<=": "\u2264",
    ">=": "\u2265",
    "co": "\u00a9",
    "rs": "\\",
}
_ESCAPE = re.compile(r"\\(\((..)|\[([^]]*)\]|f(?:\(..|\[[^]]*\]|.)|[-e&~ 0|^,/c%]|.)")
_JOIN = "\x01"
"""Where ``\\c`` joined a line to the next one."""


def man_dirs() -> list[Path]:
    """Directories that may hold the pages, in the order they are searched."""
    checkout = Path(__file__).resolve().parent.parent / "man"
    installed = Path(sysconfig.get_path("data")) / "share" / "man"
    return [checkout] + [installed / f"man{s}" for s in SECTIONS]


def find_page(topic: str) -> Path | None:
    """The page for ``topic``: "kl" or "" for kl(1), "topics" or "kl-topics" for
    kl-topics(1), "spark" for kl-spark(7), "kl-format.5" ..."""
    if not re.fullmatch(r"[\w.-]*", topic):
        return None
    name = topic if topic.startswith("kl") else f"kl-{topic}" if topic else "kl"
    base, _, section = name.partition(".")
    for directory in man_dirs():
        for s in [section] if section else SECTIONS:
            page = directory / f"{base}.{s}"
            if page.is_file():
                return page
    return None


def topics() -> list[str]:
    """Every page found, by the name ``kl help`` takes."""
    names = {p.name.split(".")[0] for d in man_dirs() if d.is_dir() for p in d.glob("kl*.[1357]")}
    return sorted(("kl" if n == "kl" else n[3:]) for n in names)


def _text(roff: str) -> str:
    """One line of roff text with its escapes and font changes made plain."""

    def one(match: re.Match[str]) -> str:
        whole, glyph = match.group(1), match.group(2) or match.group(3)
        if glyph is not None:
            return _GLYPHS.get(glyph, "")
        if whole.startswith("f") or whole in ("&", "0", "|", "^", ",", "/", "%"):
            return "\u00a0" if whole == "0" else ""
        return {"-": "-", "e": "\\", "~": "\u00a0", " ": "\u00a0", "c": _JOIN}.get(whole, whole)

    return _ESCAPE.sub(one, roff)


def _arguments(line: str) -> list[str]:
    """A macro line's arguments, double quotes grouping words ("" inside is a quote)."""
    found = re.findall(r'"((?:[^"]|"")*)"|((?:\\.|[^\s\\])+\\?)', line)
    return [quoted.replace('""', '"') if quoted or not bare else bare for quoted, bare in found]


def render(source: str, width: int = WIDTH) -> str:
    """The man page ``source`` (the man macros kl's pages use) as plain text: paragraphs
    filled to ``width``, a tagged paragraph's tag on a line of its own, examples as they are."""
    out: list[str] = []
    words: list[str] = []
    margins = [INDENT]  # .RS pushes, .RE pops
    indent = INDENT
    tag_next = literal = table_format = False
    table: list[list[str]] | None = None
    lead = ""  # an .IP tag, to start the paragraph's first line

    def flush() -> None:
        nonlocal lead
        if words:
            text = " ".join(words).replace(_JOIN, "")
            out.extend(
                line.replace("\u00a0", " ")
                for line in textwrap.wrap(
                    text,
                    max(width, indent + 20),
                    initial_indent=lead or " " * indent,
                    subsequent_indent=" " * indent,
                    break_on_hyphens=False,
                    break_long_words=False,
                )
            )
            words.clear()
            lead = ""

    def blank() -> None:
        flush()
        if out and out[-1]:
            out.append("")

    def add(text: str) -> None:
        nonlocal tag_next, indent
        if tag_next:  # a .TP tag: on its own line, the body indented below it
            out.append(" " * margins[-1] + text.replace("\u00a0", " "))
            indent, tag_next = margins[-1] + INDENT, False
        elif words and words[-1].endswith(_JOIN):
            first, *rest = text.split(" ")
            words[-1] = words[-1][:-1] + first
            words.extend(rest)
        else:
            words.extend(text.split(" "))

    for raw in source.splitlines():
        if raw.startswith(('.\\"', "'\\\"")):
            continue
        if table is not None:
            if raw.startswith(".TE"):
                widths = [max(len(row[i]) for row in table if i < len(row)) for i in range(max(map(len, table)))]
                for row in table:
                    out.append((" " * indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False))).rstrip())
                table = None
            elif table_format:
                table_format = not raw.rstrip().endswith(".")
            else:
                table.append([_text(cell) for cell in raw.split("\t")])
            continue
        if literal:
            if raw.startswith((".EE", ".fi")):
                literal = False
            elif not raw.startswith("."):
                out.append((" " * indent + _text(raw).replace("\u00a0", " ")).rstrip())
            continue
        if not raw.startswith("."):
            if raw.strip():
                add(_text(raw).strip())
            else:
                blank()
            continue
        macro, _, rest = raw[1:].partition(" ")
        args = [_text(a) for a in _arguments(rest)]
        if macro in ("B", "I", "SM", "SB"):
            add(" ".join(args))
        elif macro in ("BR", "RB", "IR", "RI", "BI", "IB"):
            add("".join(args))
        elif macro == "TH":
            out.extend([f"{args[0]}({args[1]})" if len(args) > 1 else " ".join(args), ""])
        elif macro in ("SH", "SS"):
            blank()
            margins, indent = [INDENT], INDENT
            out.append(("" if macro == "SH" else "   ") + " ".join(args))
        elif macro in ("PP", "P", "LP"):
            blank()
            indent = margins[-1]
        elif macro == "TP":
            blank()
            tag_next = True
        elif macro == "IP":  # .IP TAG WIDTH: a short tag (a bullet) begins the text's first line
            blank()
            tag, step = (args + [""])[0], int(args[1]) if len(args) > 1 and args[1].isdigit() else INDENT
            indent = margins[-1] + step
            if len(tag) < step:
                lead = (" " * margins[-1] + tag).ljust(indent) if tag else ""
            else:
                out.append(" " * margins[-1] + tag)
        elif macro == "RS":
            flush()
            margins.append(indent + (int(args[0]) if args and args[0].isdigit() else INDENT))
            indent = margins[-1]
        elif macro == "RE":
            flush()
            if len(margins) > 1:
                margins.pop()
            indent = margins[-1]
        elif macro in ("EX", "nf"):
            flush()
            literal = True
        elif macro == "br":
            flush()
        elif macro == "sp":
            blank()
        elif macro == "TS":
            flush()
            table, table_format = [], True
    flush()
    return "\n".join(out).rstrip() + "\n"


def show(page: Path) -> None:
    """``page`` through ``man`` when it is installed (its pager on a terminal), else as
    plain text rendered here, through click's pager on a terminal."""
    if shutil.which("man") is not None:
        done = subprocess.run(["man", "-l", str(page)], stderr=subprocess.PIPE)
        if done.returncode == 0:
            return
    text = render(page.read_text(encoding="utf-8"), width=min(shutil.get_terminal_size().columns, WIDTH))
    if sys.stdout.isatty():
        click.echo_via_pager(text)
    else:
        sys.stdout.write(text)


@click.command("help")
@click.argument("topic", required=False, default="", metavar="[TOPIC]")
def help_command(topic: str) -> None:
    """Show kl's manual: kl(1), or the page of TOPIC (a command, spark, format, protocol).

    Through man where it is installed, else as plain text (no man, groff or mandoc needed).
    """
    page = find_page(topic)
    if page is None:
        known = ", ".join(t for t in topics() if t != "kl")
        raise click.UsageError(f"no page for {topic!r}" + (f" (there are: {known})" if known else ""))
    sys.stdout.flush()
    show(page)
