"""The CLI's exit-code contract, through the real entry point."""


def test_help_lists_verbs(cli):
    r = cli("--help")
    assert r.returncode == 0
    assert "fabricpace" in r.stdout.lower() or "Usage" in r.stdout


def test_unknown_command_is_usage_error(cli):
    r = cli("no-such-verb")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
