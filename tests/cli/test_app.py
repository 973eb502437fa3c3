"""The CLI's exit-code contract, through the real entry point."""


def test_help_lists_verbs(cli):
    r = cli("--help")
    assert r.returncode == 0
    assert "fabricpace" in r.stdout.lower() or "Usage" in r.stdout


def test_unknown_command_is_usage_error(cli):
    r = cli("no-such-verb")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr


def _one_line_usage_error(r, *needles):
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr  # no usage block, no rich box
    assert lines[0].startswith("fabricpace: error: ")
    for needle in needles:
        assert needle in lines[0]
    assert r.stdout == ""


def test_typo_in_an_option_is_one_line_naming_it_and_the_help(cli):
    r = cli("collective", "--clster", "dgx-h100-ib")
    _one_line_usage_error(r, "--clster", "--cluster", "fabricpace collective --help")


def test_bad_option_value_is_one_line(cli):
    r = cli("simulate", "--nodes", "abc")
    _one_line_usage_error(r, "--nodes", "fabricpace simulate --help")


def test_option_without_value_is_one_line(cli):
    _one_line_usage_error(cli("collective", "--nodes"), "--nodes")


def test_unknown_verb_is_one_line_with_a_suggestion(cli):
    _one_line_usage_error(cli("studdy"), "studdy", "study")


def test_missing_argument_of_a_subcommand_is_one_line(cli):
    _one_line_usage_error(cli("export", "perfetto"), "Missing argument", "fabricpace export perfetto --help")


def test_group_without_subcommand_prints_its_help(cli):
    r = cli("lab")
    assert r.returncode == 2
    assert "up" in r.stdout and "down" in r.stdout
    assert "Traceback" not in r.stderr


def test_subcommand_help_exits_zero(cli):
    r = cli("lab", "run", "--help")
    assert r.returncode == 0
    assert "--scenario" in r.stdout


def test_run_passes_the_scripts_failure_through(cli, tmp_path):
    # typer.Exit(code) of `fabricpace run` comes back as app()'s return value outside standalone mode.
    import pytest

    pytest.importorskip("torch")
    script = tmp_path / "fails.py"
    script.write_text("import sys\nsys.exit(3)\n")
    r = cli("run", "--nproc", "1", "--", str(script))
    assert r.returncode == 3  # the script's own code (torchrun alone would exit 1)
    assert "fabricpace: error" not in r.stderr


def test_bad_window_or_warmup_is_named_as_the_option_and_writes_nothing(cli, tmp_path):
    out = tmp_path / "run"
    r = cli("simulate", "--scenario", "paper", "--warmup", "-5", "--steps", "30", "--out", str(out))
    assert r.returncode == 2 and "--warmup -5" in r.stderr
    assert not out.exists()  # was: the whole run simulated and written, then the summary refused
    r = cli("study", "--scenario", "paper", "--window", "0", "--out", str(out))
    assert r.returncode == 2 and "--window 0" in r.stderr
    assert not out.exists()  # was: an empty study folder left behind


def test_study_help_says_where_defaults_come_from(cli):
    r = cli("study", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.replace("│", " ").split())  # undo rich's box and wrapping
    assert "(default: the scenario's, else 4,8,16)" in text
    assert "(default: the scenario's, else 3)" in text


def test_version_names_fabricpace_python_and_torch(cli):
    import platform

    import fabricpace

    r = cli("--version")
    assert r.returncode == 0 and r.stderr == ""
    line = r.stdout.strip()
    assert line.startswith(f"fabricpace {fabricpace.__version__} (Python {platform.python_version()}, torch ")
    assert line.count("\n") == 0


def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    """typer turns Ctrl-C into an exit code of 130 that came back silently: the user saw nothing."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "study"
    p = subprocess.Popen(
        [sys.executable, "-m", "fabricpace.cli.app", "study", "--scenario", "paper", "--steps", "5000",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120
    while not (out / "runs").exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the study is running (its first run folder exists): the CLI is in charge
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert err.strip().splitlines()[-1] == "fabricpace: error: interrupted"
