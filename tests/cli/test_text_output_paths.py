"""Text output prints user-given names (run directories, hosts files) exactly as given.

``diagnose`` and ``place`` print through rich, which reads ``[...]`` as markup. Before session 8 a
run directory named like a sweep point, ``exp[lr=0.1]``, was shown as ``exp`` (rich took ``[lr=0.1]``
for a style), and a path holding ``[/...]`` (``sweep[/b]``: a folder ``sweep[`` with ``b]`` inside)
crashed the command with a rich MarkupError traceback after the work was done.
"""

from __future__ import annotations

from pathlib import Path


def _simulated_run(cli, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    r = cli("simulate", "--cluster", "single-switch", "--workload", "bert-large", "--nodes", "2",
            "--steps", "30", "--warmup", "5", "--out", str(out))
    assert r.returncode == 0, r.stderr


def test_diagnose_text_shows_bracketed_run_directories_verbatim(cli, tmp_path):
    sweep = tmp_path / "exp[lr=0.1]"
    odd = tmp_path / "sweep[" / "b]"  # the path reads ".../sweep[/b]"
    _simulated_run(cli, sweep)
    _simulated_run(cli, odd)
    r = cli("diagnose", str(sweep), str(odd))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "MarkupError" not in r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith(f"{sweep}  16 ranks / 2 nodes") for line in lines), r.stdout
    assert any(line.startswith(f"{odd}  16 ranks / 2 nodes") for line in lines), r.stdout


def test_place_text_shows_a_bracketed_hosts_path_verbatim(cli, tmp_path):
    folder = tmp_path / "rack[" / "a]"  # ".../rack[/a]/hosts.txt"
    folder.mkdir(parents=True)
    hosts = folder / "hosts.txt"
    hosts.write_text("h0 slots=8\nh1 slots=8\nh2 slots=8\nh3 slots=8\n")
    out = folder / "placed[1].txt"
    r = cli("place", "--cluster", "roce-leaf-spine-2to1", "--hosts", str(hosts), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert f"{hosts}: no host says node=K or leaf=L" in r.stdout
    assert f"(written to {out})" in r.stdout
    assert out.read_text().split() == ["h0", "slots=8", "h1", "slots=8", "h2", "slots=8", "h3", "slots=8"]


def test_counts_of_one_read_singular(cli, tmp_path):
    """Before session 8: 'imported kineto -> …: 1 ranks' and 'run  1 ranks / 1 nodes'."""
    src = Path(__file__).parents[1] / "importers" / "data" / "real_gloo"
    one = tmp_path / "trace"
    one.mkdir()
    trace = sorted(src.iterdir())[0]
    (one / trace.name).write_bytes(trace.read_bytes())
    out = tmp_path / "one"
    r = cli("import", "kineto", str(one), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert f"imported kineto -> {out}: 1 rank, 6 steps, 6 collective rows, 0 op rows" in r.stdout
    r = cli("diagnose", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{out}  1 rank / 1 node, ")
