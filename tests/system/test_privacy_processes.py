"""Cancelling masks between real OS processes over mutual TLS: every agent agrees its pair
keys from the run's certificates (X25519 in the certificate, checked against the fleet's
authority), the run's results and summary carry what was spent, and no mask key is in any
log, record or file the run leaves; without TLS the fleet is refused with one line."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from airgossip.common.security.tls import TlsCredentials
from airgossip.edge.agent import fleet_digest
from airgossip.edge.privacy.keys import CertificateSecrets, mask_key
from airgossip.edge.tasks import TaskContext, load_task
from tests.support.cli import airgossip, assert_one_line_error
from tests.support.processes import kill_all, wait_until_gone

pytestmark = pytest.mark.slow
pytest.importorskip("opacus")

SCENARIO = """\
agents = 3
rounds = 4
topology = "ring"
algorithm = "push-sum"
[task]
name = "digits"
hidden = 8
[network]
loss = 0.1
[privacy]
mechanism = "cancelling"
target_epsilon = 4.0
"""


def test_processes_agree_pair_keys_over_tls_and_leak_none(tmp_path: Path) -> None:
    scenario = tmp_path / "cancelling.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "run"
    try:
        result = airgossip("run", "--config", str(scenario), "--out", str(out), timeout=300)
        assert result.returncode == 0, result.stderr + result.stdout
        data = json.loads((out / "results.json").read_text())
        assert data["final"]["complete"] and data["final"]["agents_reporting"] == 3
        privacy = data["privacy"]
        assert privacy["mechanism"] == "cancelling" and 3.9 <= privacy["epsilon"] <= 4.0
        assert privacy["mask_multiplier"] == pytest.approx(privacy["noise_multiplier"])
        assert "cancelling · ε 4" in result.stdout
        assert wait_until_gone(str(out)) == []
        # The keys every pair used, recomputed from the run's certificates: none is anywhere
        # in what the run left (logs, records, results, config), in any usual encoding.
        certs = out / "certs"
        secrets = {
            i: CertificateSecrets(TlsCredentials.load(certs / i, i), certs / i)
            for i in ("agent-0", "agent-1", "agent-2")
        }
        task = load_task("digits", TaskContext(0, 3, 0, options={"hidden": 8}))
        context = f"0:{fleet_digest(task, task.initial_parameters())}".encode()
        keys = []
        for a, b in (("agent-0", "agent-1"), ("agent-1", "agent-2"), ("agent-0", "agent-2")):
            shared = secrets[a]._key.exchange(secrets[a]._peer_key(b))
            keys += [shared, mask_key(shared, a, b, context)]
            assert secrets[b].mask_key(a, context) == keys[-1]
        files = [p for p in out.rglob("*") if p.is_file() and certs not in p.parents]
        assert any(p.suffix == ".log" for p in files) and any(p.suffix == ".jsonl" for p in files)
        blob = b"".join(p.read_bytes() for p in files) + result.stdout.encode()
        blob += result.stderr.encode()
        for secret in keys:
            for form in (secret, secret.hex().encode(), base64.b64encode(secret)):
                assert form not in blob
    finally:
        kill_all(str(out))


def test_processes_without_tls_are_refused_cancelling_masks(tmp_path: Path) -> None:
    scenario = tmp_path / "cancelling.toml"
    scenario.write_text(SCENARIO)
    result = airgossip("run", "--config", str(scenario), "--insecure", "--out",
                       str(tmp_path / "run"), timeout=120)  # fmt: skip
    assert_one_line_error(result, "cancelling", "TLS", "--insecure")
