"""The README's transcripts read as the code prints: its error lines word for word, its run's
banner and summary rows with their numbers aside (``docs/readme_transcripts.py`` writes
them from real runs; its ``--check`` is what runs here, and it sees a changed line)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from airgossip.cli.choices import registry_names
from tests.support.cli import ROOT


def _transcripts() -> ModuleType:
    path = ROOT / "docs" / "readme_transcripts.py"
    spec = importlib.util.spec_from_file_location("readme_transcripts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


transcripts = _transcripts()
README = (ROOT / "README.md").read_text()


def test_the_readme_reads_as_the_code_prints() -> None:
    assert transcripts.check(README) == []


def test_every_owned_block_is_there_and_the_errors_name_real_commands() -> None:
    assert set(transcripts.blocks(README)) == {"run", "consensus", "errors"}
    commands = transcripts.commands(transcripts.body(README, "errors"))
    assert [args[:2] for args, _ in commands] == [
        ["run", "--topology"],
        ["run", "--algorithm"],
    ]
    assert all(len(shown) == 1 and shown[0].startswith("error: ") for _, shown in commands)


def _changed(block: str, old: str, new: str) -> str:
    """The README with one line of ``block`` changed."""
    start, end = transcripts.blocks(README)[block]
    assert old in README[start:end]
    return README[:start] + README[start:end].replace(old, new, 1) + README[end:]


@pytest.mark.parametrize(
    ("block", "old", "new", "named"),
    [
        ("errors", "error: bad settings: topology: ", "error: ", "--topology star"),
        ("errors", "choose one of: complete, ring,", "choose one of: ring,", "--topology star"),
        ("errors", "needs an undirected graph", "needs a symmetric graph", "--algorithm dpsgd"),
        ("run", "  bytes sent  ", "  bytes moved ", "the summary"),
        ("run", " · push-sum · task digits", " · push-sum · digits", "the banner"),
        ("run", " lost (exponential", " dropped (exponential", "the summary"),
    ],
)
def test_the_check_sees_a_changed_transcript_line(
    block: str, old: str, new: str, named: str
) -> None:
    problems = transcripts.check(_changed(block, old, new))
    assert len(problems) == 1 and named in problems[0], problems


def test_numbers_alone_are_not_drift() -> None:
    """Figures move with the machine: a run's numbers differ, its wording does not."""
    assert transcripts.shape("  messages   958 sent, 94 lost (loss 0.1)") == transcripts.shape(
        "  messages   1200 sent, 3 lost (loss 0.25)"
    )
    assert transcripts.shape("relative error 4.3e-16") == transcripts.shape("relative error 2e-15")


#: The README's ``airgossip run`` flags whose row lists what a registry holds.
LISTED = {"--topology": "topologies", "--algorithm": "algorithms", "--compression": "codecs",
          "--mode": "mode_names", "--task": "tasks"}  # fmt: skip


@pytest.mark.parametrize("flag", list(LISTED))
def test_the_readme_flag_table_names_everything_its_registry_holds(flag: str) -> None:
    """The table is written by hand: a name added to a registry fails here until the README
    says what it is."""
    row = next(line for line in README.splitlines() if line.startswith(f"| `{flag}` |"))
    names = registry_names()[LISTED[flag]].split(", ")
    missing = [n for n in names if f"`{n.partition(':')[0]}" not in row]
    assert not missing, f"README's {flag} row does not name {missing}"
