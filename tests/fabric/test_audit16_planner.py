"""Audit 16 (capacity planner) findings on the fabric model and `fabricpace collective`, through the real CLI
and real files: non-finite cluster values, forced algorithms NCCL cannot run, calibration logs of
collectives the model lacks or with wrong results, sizes outside the calibrated range, --explain."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fabricpace.fabric.cluster import PRESET_DIR


def _cluster_file(tmp_path: Path, name: str, preset: str = "dgx-h100-ib", **changes: dict) -> Path:
    data = yaml.safe_load((PRESET_DIR / f"{preset}.yaml").read_text())
    for section, values in changes.items():
        data[section] = {**data.get(section, {}), **values}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ---- finding 9: non-finite numbers in a cluster file ------------------------------------------------------
@pytest.mark.parametrize(
    ("section", "field", "text"),
    [("intra_node", "bandwidth_gbytes", ".inf"), ("network", "hop_latency_us", ".nan"),
     ("tuning", "base_us", ".inf")],
)
def test_non_finite_cluster_values_are_refused(cli, refused, tmp_path, section, field, text):
    path = _cluster_file(tmp_path, "c.yaml", **{section: {field: 1.0}})
    path.write_text(path.read_text().replace(f"{field}: 1.0", f"{field}: {text}"))
    r = cli("collective", "--cluster", str(path), "--nodes", "2", "--sizes", "1G")
    refused(r, str(path), f"{section}.{field}", "finite")
