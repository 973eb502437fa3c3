"""Pins the public API: adding or removing a public name must be a deliberate change here."""

import fabricpace


def test_all_is_pinned():
    assert sorted(fabricpace.__all__) == sorted(
        [
            "BalancedSampler",
            "ConfigError",
            "FabricpaceError",
            "InputError",
            "LabError",
            "Observer",
            "ObserverError",
            "ParseError",
            "RunData",
            "RunDirError",
            "SimulationError",
            "__version__",
            "diagnose",
            "load_cluster",
            "load_run",
            "observe",
            "simulate",
        ]
    )


def test_every_exported_name_resolves():
    for name in fabricpace.__all__:
        assert getattr(fabricpace, name) is not None, name


def test_errors_form_one_tree():
    for name in ("ConfigError", "InputError", "LabError", "ObserverError", "ParseError", "RunDirError"):
        assert issubclass(getattr(fabricpace, name), fabricpace.FabricpaceError)
