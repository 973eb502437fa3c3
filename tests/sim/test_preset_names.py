"""Unknown preset names in simulator inputs: the message names the kind of preset correctly."""

from __future__ import annotations

import pytest

from fabricpace._errors import ConfigError
from fabricpace.sim._config import resolve


@pytest.mark.parametrize(
    ("kind", "word"), [("noise", "noise"), ("workloads", "workload"), ("scenarios", "scenario")]
)
def test_unknown_preset_names_its_kind(kind, word):
    with pytest.raises(ConfigError) as err:
        resolve("no-such-name", kind)
    assert str(err.value).startswith(f"no-such-name: unknown {word} preset;")  # was 'unknown nois preset'


def test_cli_names_the_noise_preset(cli, tmp_path):
    r = cli("simulate", "--scenario", "paper", "--noise", "nope", "--out", str(tmp_path / "run"))
    assert r.returncode == 2
    assert "nope: unknown noise preset" in r.stderr
    assert not (tmp_path / "run").exists()


def test_a_mistyped_preset_is_named_with_the_close_ones():
    # audit 17 A1 finding 5: a typo in a preset name listed every preset but pointed at none
    with pytest.raises(ConfigError) as err:
        resolve("gpt-13b", "workloads")
    assert "gpt-13b: unknown workload preset (did you mean 'gpt-1.3b'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        resolve("jiter", "noise")
    assert "(did you mean 'jitter'?); use a YAML file or one of the presets:" in str(err.value)
    with pytest.raises(ConfigError) as err:
        resolve("no-such-name", "scenarios")
    assert "use a scenario folder (one holding scenario.yaml)" in str(err.value)
