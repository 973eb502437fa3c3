"""Bad workload, noise, scenario, cluster and hosts files: one line naming file and field, exit 2.

Before: a non-UTF-8 workload, noise, scenario or hosts file was a UnicodeDecodeError traceback (exit 1);
a key given twice in any YAML file was dropped silently (a second ``slow:`` block removed the first
fault); a misspelt workload/scenario key was reported only as the real key "missing"; and workload
values without an upper bound hung (``bucket_mb: 0.0001``), crashed (``parameters: 1e18``,
MemoryError) or printed NaN with exit 0 (``tflops: 1e-9``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

WORKLOAD = (
    "name: small\n"
    "parameters: 2.0e7\n"
    "layers: 8\n"
    "grad_bytes: 4\n"
    "batch_per_gpu: 16\n"
    "compute: {seconds: 0.1}\n"
)




def _sim(cli, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "run"
    r = cli("simulate", "--nodes", "2", "--steps", "12", "--warmup", "2", "--out", str(out), *args,
            timeout=120)
    if r.returncode != 0:
        assert not out.exists() or not any(out.iterdir()), "a refused simulation wrote a run"
    return r


@pytest.fixture
def workload(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text(WORKLOAD)
    return p


# ---- non-UTF-8 files ---------------------------------------------------------------------------------


def test_a_latin1_workload_is_one_line(cli, tmp_path, refused):
    w = tmp_path / "w.yaml"
    w.write_bytes(("# caf\u00e9 model\n" + WORKLOAD).encode("latin-1"))
    refused(_sim(cli, tmp_path, "--cluster", "single-switch", "--workload", str(w)),
             str(w), "not UTF-8", "save it as UTF-8")


def test_a_binary_noise_file_is_one_line(cli, tmp_path, workload, refused):
    n = tmp_path / "n.yaml"
    n.write_bytes(bytes(range(256)) * 4)
    refused(_sim(cli, tmp_path, "--cluster", "single-switch", "--workload", str(workload), "--noise",
                  str(n)), str(n), "not UTF-8")


def test_a_utf16_scenario_is_one_line_for_simulate_and_study(cli, tmp_path, refused):
    sc = tmp_path / "sc"
    sc.mkdir()
    (sc / "scenario.yaml").write_text("cluster: single-switch\nworkload: bert-large\n", encoding="utf-16")
    refused(_sim(cli, tmp_path, "--scenario", str(sc)), "scenario.yaml", "not UTF-8")
    r = cli("study", "--scenario", str(sc), "--nodes", "2", "--steps", "12", "--warmup", "2",
            "--out", str(tmp_path / "study"))
    refused(r, "scenario.yaml", "not UTF-8")
    assert not (tmp_path / "study").exists()


def test_a_binary_hosts_file_is_one_line(cli, tmp_path, refused):
    hosts = tmp_path / "hosts.txt"
    hosts.write_bytes(b"node\xe9\xff\x00 slots=8\n")
    refused(cli("place", "--cluster", "roce-leaf-spine-2to1", "--hosts", str(hosts)), str(hosts),
             "not UTF-8")


# ---- keys given twice --------------------------------------------------------------------------------


def test_a_noise_key_given_twice_is_refused_with_its_line(cli, tmp_path, workload, refused):
    n = tmp_path / "n.yaml"
    n.write_text("jitter: {cv: 0.02}\nslow:\n  - {node: 0, factor: 1.5}\nslow:\n  - {node: 1, factor: 1.2}\n")
    refused(_sim(cli, tmp_path, "--cluster", "single-switch", "--workload", str(workload), "--noise",
                  str(n)), f"{n}:4: key 'slow' given twice", "merge them")


@pytest.mark.parametrize("kind", ["workload", "cluster", "scenario", "nested"])
def test_every_yaml_file_refuses_a_key_given_twice(cli, tmp_path, workload, kind, refused):
    if kind == "workload":
        w = tmp_path / "w2.yaml"
        w.write_text(WORKLOAD + "batch_per_gpu: 32\n")
        args, needle = ("--cluster", "single-switch", "--workload", str(w)), f"{w}:7: key 'batch_per_gpu'"
    elif kind == "nested":
        w = tmp_path / "w2.yaml"
        w.write_text(WORKLOAD + "parallelism:\n  bucket_mb: 25\n  tp: 1\n  bucket_mb: 50\n")
        args, needle = ("--cluster", "single-switch", "--workload", str(w)), f"{w}:10: key 'bucket_mb'"
    elif kind == "cluster":
        c = tmp_path / "c.yaml"
        c.write_text("name: c\nnodes: 4\ngpus_per_node: 8\nnodes: 8\n")
        args, needle = ("--cluster", str(c), "--workload", str(workload)), f"{c}:4: key 'nodes' given twice"
    else:
        sc = tmp_path / "sc"
        sc.mkdir()
        (sc / "scenario.yaml").write_text(
            f"cluster: single-switch\nworkload: {workload}\ncluster: single-switch\n"
        )
        args, needle = ("--scenario", str(sc)), "scenario.yaml:3: key 'cluster' given twice"
    refused(_sim(cli, tmp_path, *args), needle)


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    from fabricpace._yaml import parse_yaml

    doc = parse_yaml("base: &b {cv: 0.1, seed: 1}\njitter:\n  <<: *b\n  cv: 0.2\n", source="x.yaml")
    assert doc["jitter"] == {"cv": 0.2, "seed": 1}


# ---- misspelt keys -----------------------------------------------------------------------------------


def test_a_misspelt_workload_key_is_named_with_a_suggestion(cli, tmp_path, refused):
    w = tmp_path / "w.yaml"
    w.write_text(WORKLOAD.replace("batch_per_gpu", "batch_per_gp"))
    line = refused(_sim(cli, tmp_path, "--cluster", "single-switch", "--workload", str(w)),
                    "unknown key 'batch_per_gp' (did you mean 'batch_per_gpu'?)")
    assert "missing" not in line


def test_a_misspelt_nested_workload_key_is_named_with_a_suggestion(cli, tmp_path, refused):
    w = tmp_path / "w.yaml"
    w.write_text(WORKLOAD + "parallelism: {bucket_m: 25}\n")
    refused(_sim(cli, tmp_path, "--cluster", "single-switch", "--workload", str(w)),
             "unknown key 'parallelism.bucket_m' (did you mean 'bucket_mb'?)")


def test_a_misspelt_scenario_key_is_named_with_a_suggestion(cli, tmp_path, workload, refused):
    sc = tmp_path / "sc"
    sc.mkdir()
    (sc / "scenario.yaml").write_text(f"cluster: single-switch\nwrkload: {workload}\n")
    line = refused(_sim(cli, tmp_path, "--scenario", str(sc)),
                    "unknown key 'wrkload' (did you mean 'workload'?)")
    assert "missing" not in line


# ---- workload values without bounds ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        # 24,989,919 buckets: ran for minutes without end
        (("parameters: 2.0e7", "parameters: 1.3e9\nparallelism: {bucket_mb: 0.0001}"),
         ("field 'parallelism.bucket_mb'", "buckets (at most 1,000,000)", "use at least")),
        # MemoryError traceback
        (("parameters: 2.0e7", "parameters: 1e18"), ("field 'parameters'", "1e+18")),
        # NaN throughput, exit 0
        (("compute: {seconds: 0.1}", "compute: {flops_per_sample: 1.6e13, tflops: 1.0e-9}"),
         ("field 'compute'", "s per step", "check the units")),
        (("compute: {seconds: 0.1}", "compute: {flops_per_sample: 1.6e13, tflops: .inf}"),
         ("field 'compute.tflops'", "finite")),
        (("compute: {seconds: 0.1}", "compute: {seconds: 0.1}\noptimizer_seconds: 1e12"),
         ("field 'optimizer_seconds'",)),
    ],
    ids=["tiny-bucket", "huge-parameters", "tiny-tflops", "infinite-tflops", "huge-optimizer"],
)
def test_workload_values_out_of_bounds_are_one_line(cli, tmp_path, change, needles, refused):
    w = tmp_path / "w.yaml"
    w.write_text(WORKLOAD.replace(*change))
    refused(_sim(cli, tmp_path, "--cluster", "single-switch", "--workload", str(w)), str(w), *needles)


# ---- list entries, bound errors and mistyped scenario folders (audit 17 A1 finding 5) ------------------


def test_a_misspelt_key_in_a_list_entry_gets_a_suggestion(cli, tmp_path, workload, refused):
    # before: "unknown key 'slow.0.factr'; fix the spelling ..." without the nearest key, unlike
    # top-level and nested mapping keys
    n = tmp_path / "n.yaml"
    n.write_text("slow: [{node: 1, factor: 1.2}, {node: 0, factr: 1.2}]\n")
    refused(_sim(cli, tmp_path, "--cluster", "single-switch", "--workload", str(workload), "--noise",
                  str(n)), str(n), "unknown key 'slow.1.factr' (did you mean 'factor'?)")


@pytest.mark.parametrize(
    ("kind", "text", "needles"),
    [
        ("noise", "slow: [{node: 1, factor: 0}]\n",
         ("field 'slow.0.factor'", "greater than 0", "(got 0)", "; fix it (see docs/simulator.md)")),
        ("noise", "jitter: {cv: 1.5}\n",
         ("field 'jitter.cv'", "(got 1.5)", "; fix it (see docs/simulator.md)")),
        ("workload", WORKLOAD.replace("batch_per_gpu: 16", "batch_per_gpu: 0"),
         ("field 'batch_per_gpu'", "(got 0)", "; fix it (see docs/simulator.md)")),
        ("scenario", "name: t\ncluster: single-switch\nworkload: WL\nstudy: {steps: -5}\n",
         ("field 'study.steps'", "(got -5)", "; fix it (see docs/simulator.md)")),
        ("scenario", "name: t\ncluster: single-switch\nstudy: {steps: 10}\n",
         ("field 'workload': required field is missing", "; add it (see docs/simulator.md)")),
    ],
    ids=["noise-factor", "noise-cv", "workload-batch", "scenario-steps", "scenario-missing"],
)
def test_bound_errors_name_the_value_got_and_the_fix(cli, tmp_path, workload, kind, text, needles,
                                                      refused):
    # before: "field 'slow.0.factor': Input should be greater than 0" and nothing more, where a cluster
    # file says "... (got 0); fix it (see docs/cluster-files.md)"
    if kind == "scenario":
        folder = tmp_path / "sc"
        folder.mkdir()
        f = folder / "scenario.yaml"
        f.write_text(text.replace("WL", str(workload)))
        args: tuple[str, ...] = ("--scenario", str(folder))
    else:
        f = tmp_path / f"{kind}.yaml"
        f.write_text(text)
        w = f if kind == "workload" else workload
        args = ("--cluster", "single-switch", "--workload", str(w))
        if kind == "noise":
            args += ("--noise", str(f))
    refused(_sim(cli, tmp_path, *args), str(f), *needles)


def test_a_mistyped_scenario_folder_says_what_a_scenario_is_and_names_the_close_ones(cli, tmp_path,
                                                                                      refused):
    # before: "sc/s01-tiny-dgx-rnk3: file not found; use a YAML file or one of the presets: paper" —
    # a scenario is a folder, and passing scenario.yaml itself is not what the user meant
    root = tmp_path / "sc"
    for name in ("s01-tiny-dgx-rank3", "s02-other"):
        (root / name).mkdir(parents=True)
        (root / name / "scenario.yaml").write_text("name: t\ncluster: single-switch\nworkload: gpt-1.3b\n")
    line = refused(_sim(cli, tmp_path, "--scenario", str(root / "s01-tiny-dgx-rnk3")),
                   "no such scenario folder", f"did you mean {str(root / 's01-tiny-dgx-rank3')!r}",
                   "a scenario is a folder holding scenario.yaml", "or a preset: paper")
    assert "use a YAML file" not in line
    line = refused(_sim(cli, tmp_path, "--scenario", "papr"), "papr:", "no such scenario folder",
                   "did you mean 'paper'")
    assert "use a YAML file" not in line
