"""A long session is shown in part by default — its latest turns (or records) — and whole with
``--all`` or in a range with ``--turns A-B``; what is left out is said. (The 5,000-turn bound on
time and memory is measured in ``bench/cli_reads.py``, not here.)"""

from __future__ import annotations

import json

import pytest
from bench.cli_reads import SESSION, build

from toolledger.cli.app import main


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    made = f"sqlite:///{tmp_path_factory.mktemp('window') / 'w.db'}"
    build(made, 60)
    return made


def shown(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main([*argv, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


def turn_numbers(timeline: object) -> set[int]:
    assert isinstance(timeline, list)
    return {int(e["tool_use_id"][6:14]) + 1 for e in timeline if e["tool_use_id"]}


def test_show_and_history_default_to_the_latest_turns(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = shown(capsys, "show", SESSION, "--store", url)
    assert out["window"] == {"unit": "turn", "first": 41, "last": 60, "total": 60}
    assert turn_numbers(out["timeline"]) == set(range(41, 61))
    out = shown(capsys, "show", SESSION, "--store", url, "--all")
    assert turn_numbers(out["timeline"]) == set(range(1, 61))
    out = shown(capsys, "show", SESSION, "--store", url, "--turns", "3-5")
    assert turn_numbers(out["timeline"]) == {3, 4, 5}
    out = shown(capsys, "history", SESSION, "--store", url, "--last", "2")
    turns = out["turns"]
    assert isinstance(turns, list) and [t["turn"] for t in turns] == [59, 60]


def test_effects_default_to_the_latest_records_and_say_so(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["effects", SESSION, "--store", url]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("toolu_")]
    assert len(rows) == 50 and rows[-1].startswith("toolu_00000059")
    assert "# showing records 11-60 of 60: --all shows every record" in out
    assert main(["effects", SESSION, "--store", url, "--all"]) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if line.startswith("toolu_")]) == 60
    assert "showing" not in out


def test_a_bad_range_is_a_usage_error(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["show", SESSION, "--store", url, "--turns", "five"])
    assert exc.value.code == 2
    assert "not a range" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["show", "--turns", "3-1"], "runs backwards: write 1-3"),
        (["show", "--turns", "0-2"], "the first is 1"),
        (["show", "--last", "-1"], "show at least 1"),
        (["show", "--last", "0"], "show at least 1"),
        (["effects", "--records", "2-1"], "runs backwards"),
    ],
)
def test_a_range_that_shows_nothing_by_mistake_is_a_usage_error(
    url: str, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    """A reversed range or a count below 1 is a mistake, not "the range is past the end"."""
    command, *options = argv
    with pytest.raises(SystemExit) as exc:
        main([command, SESSION, "--store", url, *options])
    assert exc.value.code == 2
    assert said in capsys.readouterr().err
