"""Copy the alert rules into the Kubernetes Prometheus ConfigMap.

    python deploy/prometheus/sync_kubernetes.py   # rewrites deploy/kubernetes/prometheus.yaml

The ConfigMap holds ``alerts.yml`` beside ``prometheus.yml`` as its last data key (kustomize
reads no file outside its folder); ``tests/deploy/test_alert_rules.py`` checks the copy.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "prometheus" / "alerts.yml"
MANIFEST = ROOT / "kubernetes" / "prometheus.yaml"
KEY = "  alerts.yml: |\n"


def synced(manifest: str, rules: str) -> str:
    """``manifest`` with the ConfigMap's ``alerts.yml`` replaced by ``rules``."""
    config_map, separator, rest = manifest.partition("\n---\n")
    head = config_map[: config_map.index(KEY) + len(KEY)]
    block = "".join(f"    {line}" if line.strip() else "\n" for line in rules.splitlines(True))
    return head + block.rstrip("\n") + separator + rest


def main() -> None:
    MANIFEST.write_text(synced(MANIFEST.read_text(), RULES.read_text()))


if __name__ == "__main__":
    main()
