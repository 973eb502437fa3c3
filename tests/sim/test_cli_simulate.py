"""`fabricpace simulate` through the real entry point: output, and one-line errors with exit code 2."""

from __future__ import annotations

import json

import pytest


def test_simulate_writes_a_run_and_prints_json(cli, tmp_path, small_workload):
    out = tmp_path / "run"
    r = cli(
        "simulate",
        "--cluster",
        "single-switch",
        "--workload",
        str(small_workload),
        "--nodes",
        "2",
        "--steps",
        "30",
        "--out",
        str(out),
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["run_dir"] == str(out) and doc["world_size"] == 16 and doc["throughput"] > 0
    assert (out / "manifest.json").is_file() and (out / "ranks.parquet").is_file()


def _bad_cases(tmp_path, write_yaml, small_workload):
    neg = write_yaml(tmp_path / "neg.yaml", {"parameters": -5, "batch_per_gpu": 8, "compute": {"seconds": 1}})
    missing = write_yaml(tmp_path / "miss.yaml", {"parameters": 1e9, "compute": {"seconds": 1}})
    ghost = write_yaml(tmp_path / "ghost.yaml", {"slow": [{"rank": 99, "factor": 1.2}]})
    link = write_yaml(tmp_path / "link.yaml", {"links": [{"link": "leaf9->spine99", "scale": 0.5}]})
    typo = write_yaml(tmp_path / "typo.yaml", {"jiter": {"cv": 0.1}})
    based = write_yaml(tmp_path / "based.yaml", {"preset": "gpt-13b", "batch_per_gpu": 8})
    colon = tmp_path / "colon.yaml"  # free text with ": " unquoted (audit 20 wrote six such files)
    colon.write_text("name: n\ndescription: node 2 slow: 1.4x\njitter: {cv: 0.01}\n")
    return {
        "unknown preset": (["--workload", "gpt-99b"], "unknown workload preset"),
        "unknown base preset": (["--workload", str(based)], "based.yaml: field 'preset': 'gpt-13b'"),
        "negative size": (["--workload", str(neg)], "parameters"),
        "missing key": (["--workload", str(missing)], "batch_per_gpu"),
        "ghost rank": (["--workload", str(small_workload), "--noise", str(ghost)], "rank 99 does not exist"),
        # before: a traceback (numpy refuses negative seeds)
        "negative seed": (["--workload", str(small_workload), "--seed", "-1"], "--seed -1"),
        # before: the run directory was written, then the summary failed on its single step
        "one step": (["--workload", str(small_workload), "--steps", "1"], "--steps 1"),
        "unquoted colon": (["--workload", str(small_workload), "--noise", str(colon)],
                           "colon.yaml:2: not valid YAML (mapping values are not allowed here); quote"),
    }, {"unknown link": (link, "leaf9->spine99"), "unknown field": (typo, "jiter")}


@pytest.mark.parametrize(
    "case",
    [
        "unknown preset",
        "unknown base preset",
        "negative size",
        "missing key",
        "ghost rank",
        "negative seed",
        "one step",
        "unquoted colon",
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path, write_yaml, small_workload, case):
    args, needle = _bad_cases(tmp_path, write_yaml, small_workload)[0][case]
    out = tmp_path / "out"
    r = cli(
        "simulate",
        "--cluster",
        "roce-leaf-spine-2to1",
        "--nodes",
        "2",
        "--steps",
        "5",
        "--out",
        str(out),
        *args,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert needle in lines[0]
    assert not out.exists()  # nothing was written


@pytest.mark.parametrize("case", ["unknown link", "unknown field"])
def test_bad_noise_files_are_config_errors(tmp_path, write_yaml, small_workload, case):
    from fabricpace import ConfigError
    from fabricpace.sim import simulate

    noise, needle = _bad_cases(tmp_path, write_yaml, small_workload)[1][case]
    with pytest.raises(ConfigError, match=needle.replace(">", ".")):
        simulate(
            "roce-leaf-spine-2to1", small_workload, noise, nodes=2, steps=5, seed=0, out_dir=tmp_path / "o"
        )
    assert not (tmp_path / "o").exists()


def test_existing_output_is_never_overwritten(tmp_path, small_workload):
    from fabricpace import InputError
    from fabricpace.sim import simulate

    out = tmp_path / "keep"
    out.mkdir()
    (out / "mine.txt").write_text("precious")
    with pytest.raises(InputError, match="not empty"):
        simulate("single-switch", small_workload, None, nodes=1, steps=5, seed=0, out_dir=out)
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
