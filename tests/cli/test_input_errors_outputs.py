"""Outputs that cannot be written are one line naming the option, exit 2, before the work (user audit).

Before: a read-only folder gave a PermissionError traceback and exit 1 in every writing verb — for
``report`` and ``collective --save-calibration`` only after all the work; ``--save-calibration
nodir/fit.yaml`` was a FileNotFoundError traceback after the fit; ``--plot afile/p.html`` named the
internal temporary file. Default output names (``runs/sim-TIME``, to the second) collided when two
commands started in the same second, and the second was refused although the user gave no ``--out``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

DATA = Path(__file__).parents[1] / "fabric" / "data"
SIM = ("--cluster", "single-switch", "--workload", "bert-large", "--nodes", "2", "--steps", "12",
       "--warmup", "2")




def _no_override_cmd(read_only: Path) -> list[str] | None:
    """The command prefix that runs fabricpace without root's permission override (chmod binds root
    too), or None when this machine cannot drop it (``read_only`` is still writable that way)."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            return None
        prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--"]
    check = "import os, sys; sys.exit(7 if os.access(sys.argv[1], os.W_OK) else 0)"
    probe = subprocess.run([*prefix, sys.executable, "-c", check, str(read_only)], capture_output=True)
    if probe.returncode != 0:
        return None
    return [*prefix, sys.executable, "-m", "fabricpace.cli.app"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    r = subprocess.run([sys.executable, "-m", "fabricpace.cli.app", "simulate", *SIM, "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture
def read_only(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    yield folder
    folder.chmod(0o755)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("simulate", *SIM, "--out", "{ro}/run"), "--out"),
        (("study", *SIM, "--repeats", "1", "--no-figures", "--out", "{ro}/study"), "--out"),
        (("report", "{run}", "-o", "{ro}/r.html"), "--out"),
        (("export", "perfetto", "{run}", "-o", "{ro}/t.json"), "--out"),
        (("import", "nccl-tests", "{log}", "-o", "{ro}/imported"), "--out"),
        (("collective", "--calibrate", "{log}", "--nodes", "2", "--sizes", "1G",
          "--save-calibration", "{ro}/fit.yaml"), "--save-calibration"),
        (("collective", "--nodes", "2", "--sizes", "1G", "--plot", "{ro}/busbw.html"), "--plot"),
    ],
    ids=["simulate", "study", "report", "export", "import", "save-calibration", "plot"],
)
def test_a_read_only_folder_is_one_line_naming_the_option(run_dir, read_only, args, option, refused):
    prefix = _no_override_cmd(read_only)
    if prefix is None:
        pytest.skip("cannot drop root's permission override here")
    log = DATA / "h100ib_n2_all_reduce.log"
    argv = [a.format(ro=read_only, run=run_dir, log=log) for a in args]
    r = subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=300)
    refused(r, option, f"cannot write in {read_only}", "choose another folder")
    assert list(read_only.iterdir()) == []


def test_save_calibration_in_a_missing_folder_or_under_a_file_is_refused_before_the_fit(
    cli, tmp_path, refused
):
    # A log that cannot be fitted: the path is refused first, so the fit is never reached.
    garbage = tmp_path / "n2_all_reduce.log"
    garbage.write_text("not a log\n")
    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me\n")
    base = ("collective", "--calibrate", str(garbage), "--nodes", "2", "--sizes", "1G")
    refused(cli(*base, "--save-calibration", str(tmp_path / "nodir" / "fit.yaml")),
             "--save-calibration", "nodir does not exist; create it first")
    refused(cli(*base, "--save-calibration", str(blocker / "fit.yaml")),
             "--save-calibration", "is a file, not a folder")
    assert not (tmp_path / "nodir").exists() and blocker.read_text() == "keep me\n"


def test_plot_under_a_file_names_the_option_not_a_temporary_file(cli, tmp_path, refused):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me\n")
    line = refused(cli("collective", "--nodes", "2", "--sizes", "1G", "--plot", str(blocker / "p.html")),
                    "--plot", "is a file, not a folder")
    assert ".tmp" not in line


def test_an_os_error_no_check_foresaw_is_one_line_naming_the_output(monkeypatch, capsys, tmp_path):
    """The boundary's net: a PermissionError (the folder changed while the command ran) is exit 2 and
    one line naming the output, not the temporary file written next to it."""
    from fabricpace.cli import app as app_module
    from fabricpace.cli import place as place_module

    def denied(path):
        raise PermissionError(13, "Permission denied", str(tmp_path / ".r.html.1678.tmp"))

    hosts = tmp_path / "hosts.txt"
    hosts.write_text("h0 leaf=0\n")
    monkeypatch.setattr(place_module, "parse_hosts", denied)
    monkeypatch.setattr(sys, "argv", ["fabricpace", "place", "--cluster", "single-switch", "--hosts",
                                      str(hosts)])
    with pytest.raises(SystemExit) as exc:
        app_module.main()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fabricpace: error: {tmp_path / 'r.html'}: permission denied; choose another path "
                   "or fix its permissions"]


def _stamp(offset: int) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() + offset))


def test_a_default_output_name_taken_in_the_same_second_gets_a_free_sibling(cli, tmp_path, refused):
    runs = tmp_path / "runs"
    taken = []
    for offset in range(0, 4):  # the names this second and the next few (a slow start) would get
        folder = runs / f"sim-{_stamp(offset)}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "manifest.json").write_text("{}")
        taken.append(folder.name)
    r = cli("simulate", *SIM, "--format", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    import json

    run_dir = Path(json.loads(r.stdout)["run_dir"])
    assert run_dir.name.rsplit("-", 1)[0] in taken and run_dir.name.endswith("-1"), run_dir
    assert (tmp_path / run_dir / "manifest.json").read_text() != "{}"
    for name in taken:
        assert (runs / name / "manifest.json").read_text() == "{}"  # nothing the user had is touched
    # an explicit --out that exists is still refused
    refused(cli("simulate", *SIM, "--out", str(runs / taken[0])), "already exists")


def test_a_failed_command_leaves_no_empty_default_folder(cli, tmp_path, refused):
    bad = tmp_path / "w.yaml"
    bad.write_text("parameters: 1e9\nbatch_per_gpu: 8\ncompute: {seconds: 0.1}\nlayers: 0\n")
    refused(cli("simulate", "--cluster", "single-switch", "--workload", str(bad), "--nodes", "2",
                 "--steps", "12", cwd=tmp_path), "layers")
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []
