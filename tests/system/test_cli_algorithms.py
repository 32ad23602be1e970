"""The command line with every algorithm and compressor: one-line errors, honest results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, cli


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--compression", "zstd"], ["unknown compression 'zstd'", "none", "qsgd:BITS", "topk"]),
        (["--compression", "qsgd:9"], ["BITS within 1..8, got qsgd:9"]),
        (["--compression", "topk:2"], ["0 < FRACTION <= 1, got topk:2"]),
        (["--algorithm", "dpsgd"], ["algorithm 'dpsgd' needs an undirected graph", "ring"]),
        (["--algorithm", "choco", "--topology", "directed-ring"], ["'choco' needs an undirected"]),
        (["--algorithm", "dpsgd", "--topology", "ring", "--compression", "topk:0.1"],
         ["dpsgd sends whole models", "choco"]),
        (["--algorithm", "push-sum", "--compression", "qsgd:1"], ["use qsgd:2 or more bits"]),
        (["--algorithm", "gossip"], ["unknown algorithm 'gossip'", "gradient-tracking"]),
    ],
)  # fmt: skip
def test_bad_algorithm_settings_get_one_line_errors(
    args: list[str], fragments: list[str], tmp_path: Path
) -> None:
    result = cli("run", "--mode", "inproc", "--out", str(tmp_path / "out"), *args)
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "out" / "results.json").exists()


def test_bad_algorithm_options_in_a_scenario(tmp_path: Path) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text('algorithm = "choco"\ntopology = "ring"\n[algorithm_options]\ngamma = 2\n')
    result = cli("run", "--config", str(scenario))
    assert_one_line_error(result, "algorithm 'choco': option 'gamma'", "less than or equal to 1")


def test_a_compressed_run_reports_its_compression_and_bytes(tmp_path: Path) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        'mode = "inproc"\nagents = 6\nrounds = 60\nalgorithm = "quantized-push-sum"\n'
        '[algorithm_options]\ngamma = 0.5\n[task]\nname = "consensus"\n[network]\nloss = 0.2\n'
    )
    runs = {}
    for compression in ("none", "qsgd:2"):
        out = tmp_path / compression.replace(":", "")
        args = ["run", "--config", str(scenario), "--compression", compression, "--out", str(out)]
        result = cli(*args)
        assert result.returncode == 0, result.stderr
        runs[compression] = json.loads((out / "results.json").read_text())
    quantized = runs["qsgd:2"]
    assert quantized["config"]["compression"] == "qsgd:2"
    assert quantized["config"]["algorithm_options"] == {"gamma": 0.5}
    assert quantized["final"]["relative_error"] < 1e-4  # converging: exactness is tested elsewhere
    # 2 bits instead of 64 per element, but per-message headers and replays are counted too
    assert runs["none"]["final"]["bytes_sent"] > 3 * quantized["final"]["bytes_sent"]


def test_the_coordinator_command_refuses_a_graph_the_algorithm_cannot_use(tmp_path: Path) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text('algorithm = "dpsgd"\n')
    result = cli("coordinator", "--insecure", "--config", str(scenario), "--listen", "127.0.0.1:0")
    assert_one_line_error(result, "algorithm 'dpsgd' needs an undirected graph")
