"""How a command's rows reach a person or a pipe, whole at any width.

A command builds a ``Grid`` (a title, columns, rows of cells) and hands it to ``Out.grid``, which
picks one layout:

* **table** — on a terminal wide enough that every *whole* column (ids, commands, statuses,
  times: never cut, never wrapped) fits at its natural width beside a little room for each
  *preview* column (content already shortened, which may wrap);
* **records** — on a terminal too narrow for that: one field a line, ``name: value``, a blank
  line between records; a line is never broken by the program (the terminal may fold it on the
  screen; copied, it is whole);
* **tsv** — when standard output is not a terminal (a pipe, a file): a header line, then one
  line per row, cells separated by tabs. A cell is what records show of it, on one line, escaped
  once: an id as ``_shell.shown_id`` writes it (a script reads the exact id back: ``\\\\`` is a
  backslash, ``\\xHH``, ``\\uHHHH``, ``\\UHHHHHHHH`` that character, any other backslash
  itself), content as ``_shell.shown`` does (a tab, a line break as ``\\x09``, ``\\x0a``), a
  command as it is pasted. No second escaping goes on top: a backslash doubled again would
  change every command inside a cell (a session's reason names the commands that settle it),
  and ``\\'`` doubled ends a ``$'…'`` quote early, running what follows. Titles and notes are
  comment lines starting with ``# ``.

``--json`` bypasses all of this (``emit_json``). Every line is printed with ``soft_wrap``: the
program never inserts a line break into an id or a command.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .._shell import shown, shown_id

__all__ = ["Col", "Grid", "Layout", "Out"]

# What a preview column keeps at least, in a table, before the table gives way to records.
PREVIEW_MIN = 12


class Layout(StrEnum):
    TABLE = "table"
    RECORDS = "records"
    TSV = "tsv"


@dataclass(frozen=True, slots=True)
class Col:
    """A column. ``preview``: its cells are shortened content that may wrap in a table (never an
    id or a command). ``in_table=False``: shown in records and TSV only — the caller prints it
    after a table itself (the commands that settle a call, one a line). ``command``: its cells
    are commands to paste, written as they are (a quoted command holds no character that
    ``shown`` escapes: ``toolledger._shell.quote``), so that the line a file holds runs as
    written. ``words``: a preview column whose cells hold ids among their words (``ledger: NAME
    → succeeded``): a table wraps them between words only, never inside one — it is at least as
    wide as its longest word, or the grid is shown as records."""

    name: str
    preview: bool = False
    in_table: bool = True
    command: bool = False
    words: bool = False


@dataclass(slots=True)
class Grid:
    title: str
    cols: Sequence[Col]
    rows: list[list[Text]] = field(default_factory=list)
    caption: str = ""

    def add(self, *cells: Text | str) -> None:
        assert len(cells) == len(self.cols), (self.title, len(cells), len(self.cols))
        self.rows.append([c if isinstance(c, Text) else Text(c) for c in cells])


class Out:
    """Where one command prints: the console, and whether it is a terminal (``sys.stdout``'s
    own answer: ``FORCE_COLOR`` colours a pipe, it does not make one a screen)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.terminal = _isatty(console.file)

    def line(self, *parts: Text | str) -> None:
        """A line of output, never broken by the program."""
        text = Text()
        for p in parts:
            text.append_text(p if isinstance(p, Text) else Text(p))
        self.console.print(text, soft_wrap=True, highlight=False)

    def note(self, *parts: Text | str) -> None:
        """A line about the rows around it (a heading, a remark): in a pipe a ``# `` comment,
        so that what a script reads is the TSV alone. One line: a line break in its data (a
        branch's ``by``, a reason) is shown escaped, never starting a line — in a pipe, a row —
        of its own."""
        flat = [_one_line(p) for p in parts]
        if self.terminal:
            self.line(*flat)
        elif any(p.plain for p in flat):
            self.line("# ", *flat)

    def command(self, text: str, *, note: str = "") -> None:
        """A command to paste: alone on its line, never broken, never commented out (its
        explanation, if any, is the comment line before it)."""
        if note:
            self.console.print(Text(f"# {note}", style="dim"), soft_wrap=True, highlight=False)
        self.console.print(Text(text), soft_wrap=True, highlight=False)

    def reason_commands(self, session: Text, commands: Sequence[str]) -> None:
        """After a grid on a screen: the commands a session's stop reason names, whole, each
        alone on its line (its words named them by what they do: ``reason_parts``)."""
        if commands:
            self.line("")
            self.note(Text("the commands the reason of "), session, " names:")
            for c in commands:
                self.command(c)

    def grid(self, grid: Grid) -> Layout:
        """Print ``grid`` in the layout that keeps every id whole; say which."""
        if not self.terminal:
            self._tsv(grid)
            return Layout.TSV
        # A whole column's cell on one line: a line break in it would start a row, or a field,
        # that is not one (a tab would throw its width off). Previews may wrap.
        grid = Grid(
            grid.title,
            grid.cols,
            [
                [c if col.preview else _one_line(c) for col, c in zip(grid.cols, row, strict=True)]
                for row in grid.rows
            ],
            grid.caption,
        )
        if self._fits(grid):
            self._table(grid)
            return Layout.TABLE
        self._records(grid)
        return Layout.RECORDS

    # -- the layouts ---------------------------------------------------------------------------

    def _shown(self, grid: Grid) -> list[int]:
        return [i for i, c in enumerate(grid.cols) if c.in_table]

    def _natural(self, grid: Grid, i: int) -> int:
        return max([cell_len(grid.cols[i].name), *(cell_len(r[i].plain) for r in grid.rows)])

    def _least(self, grid: Grid, i: int) -> int:
        """The narrowest a column may be in a table: whole columns at their natural width,
        previews at ``PREVIEW_MIN`` (less if all of it is shorter) — and one of ``words`` no
        narrower than its longest word, which is never cut."""
        natural = self._natural(grid, i)
        if not grid.cols[i].preview:
            return natural
        longest = max((cell_len(w) for r in grid.rows for w in r[i].plain.split()), default=0)
        return max(min(natural, PREVIEW_MIN), longest if grid.cols[i].words else 0)

    def _fits(self, grid: Grid) -> bool:
        shown = self._shown(grid)
        need = 1 + 3 * len(shown)  # rich's box: a bar, and " │ " around each cell
        for i in shown:
            need += self._least(grid, i)
        return need <= self.console.width

    def _table(self, grid: Grid) -> None:
        # The title above the table, not in it: a table wraps its title to its own width, and a
        # title names a session whose id may be wider than the table.
        self.console.print(_title(grid), soft_wrap=True, highlight=False)
        table = Table(caption=grid.caption or None)
        shown = self._shown(grid)
        for i in shown:
            col = grid.cols[i]
            if col.preview:
                least = self._least(grid, i) if col.words else None
                table.add_column(col.name, overflow="fold", min_width=least)
            else:
                table.add_column(col.name, no_wrap=True, min_width=self._natural(grid, i))
        for row in grid.rows:
            table.add_row(*(row[i] for i in shown))
        self.console.print(table)

    def _records(self, grid: Grid) -> None:
        self.console.print(_title(grid), soft_wrap=True, highlight=False)
        pad = max((cell_len(c.name) for c in grid.cols), default=0)
        for row in grid.rows:
            self.console.print()
            for col, cell in zip(grid.cols, row, strict=True):
                if not cell.plain:
                    continue
                name = Text(f"{col.name}:".ljust(pad + 2), style="dim")
                line = name.append_text(_one_line(cell))  # one field, one line
                self.console.print(line, soft_wrap=True, highlight=False)
        if grid.caption:
            self.console.print()
            self.console.print(Text(grid.caption, style="dim"), soft_wrap=True, highlight=False)

    def _tsv(self, grid: Grid) -> None:
        write = self.console.file.write
        write(f"# {shown_id(grid.title)}\n")  # a comment, as a note is
        write("\t".join(shown(c.name) for c in grid.cols) + "\n")
        for row in grid.rows:
            # Each cell as records show it, escaped once (an id already is, by ``safe_id``):
            # no tab or line break is left to escape, so nothing is escaped twice.
            cells = (
                cell.plain if col.command else _one_line(cell).plain
                for col, cell in zip(grid.cols, row, strict=True)
            )
            write("\t".join(cells) + "\n")
        if grid.caption:
            write(f"# {shown(grid.caption)}\n")
        self.console.file.flush()


def _one_line(part: Text | str) -> Text:
    """``part`` on one line: its line breaks and tabs (every control) shown escaped
    (``_shell.shown``)."""
    text = part if isinstance(part, Text) else Text(part)
    flat = shown(text.plain)
    return text if flat == text.plain else Text(flat, style=text.style)


def _title(grid: Grid) -> Text:
    """A grid's title, which names the session it lists: escaped as an id is, on one line
    (``_shell.shown_id``)."""
    return Text(shown_id(grid.title), style="bold")


def _isatty(file: object) -> bool:
    isatty = getattr(file, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # closed
        return False
