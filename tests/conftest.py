"""Shared fixtures: quiet Flower, a fresh in-memory fleet helper, and process hygiene."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
torch.set_num_threads(1)
# A suite started in the background of a non-interactive shell (``./scripts/test &``)
# inherits SIGINT ignored, and so would every launcher it starts: the tests that press
# Ctrl-C on a launcher would wait in vain. An ignored signal stays ignored across exec; a
# handled one is reset to its default, so handling it here gives the children Ctrl-C back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _flower_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLWR_HOME", str(tmp_path_factory.mktemp("flwr-home")))


@pytest.fixture
def python() -> str:
    return sys.executable
