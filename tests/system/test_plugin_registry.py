"""Registries of plugins by name: names without imports, a plugin loaded when looked up."""

from __future__ import annotations

import sys

import pytest

from airgossip.common.plugins import PluginRegistry


class Toy:
    name = "toy"
    summary = "a plugin defined in a test"


def test_names_cost_no_import_and_a_look_up_loads_the_plugin() -> None:
    registry: PluginRegistry[type] = PluginRegistry(
        "toy", {"json-decoder": ("json.decoder:JSONDecoder", "a decoder"),
                "missing": "airgossip_no_such_module:Thing"},
        declares=None,
    )  # fmt: skip
    assert list(registry) == ["json-decoder", "missing"] and len(registry) == 2
    assert "missing" in registry and "other" not in registry
    assert registry.summary("json-decoder") == "a decoder" and registry.summary("missing") == ""
    assert "airgossip_no_such_module" not in sys.modules  # listed, never imported
    import json.decoder

    assert registry["json-decoder"] is json.decoder.JSONDecoder
    with pytest.raises(ModuleNotFoundError, match="airgossip_no_such_module"):
        registry["missing"]


def test_an_unknown_name_and_a_wrong_line_say_what_is_wrong() -> None:
    registry: PluginRegistry[type] = PluginRegistry(
        "algorithm", {"push-sum": "tests.system.test_plugin_registry:Toy"}
    )
    with pytest.raises(ValueError, match="unknown algorithm 'gossip'; choose one of: push-sum"):
        registry.get_plugin("gossip")
    with pytest.raises(
        LookupError, match=r"'push-sum' is registered as .*Toy, which declares 'toy'"
    ):
        registry["push-sum"]
    with pytest.raises(ValueError, match="'nowhere' is not module:attribute"):
        PluginRegistry("task", {"x": "nowhere"})


def test_a_loaded_plugin_registers_under_its_name_and_leaves_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry: PluginRegistry[type] = PluginRegistry("toy", {})
    with monkeypatch.context() as patched:
        patched.setitem(registry, "toy", Toy)
        assert list(registry) == ["toy"] and registry.get_plugin("toy") is Toy
        assert registry.summary("toy") == "a plugin defined in a test"
        assert registry.target("toy") == f"{__name__}:Toy"
    assert list(registry) == []
