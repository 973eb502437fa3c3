"""`fabricpace demo` refuses bad input before starting any work (the full demo is `make demo`)."""


def test_demo_refuses_a_non_empty_out_folder(cli, tmp_path):
    keep = tmp_path / "mine.txt"
    keep.write_text("user data")
    r = cli("demo", "--out", str(tmp_path))
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "--out" in r.stderr
    assert keep.read_text() == "user data"


def test_demo_refuses_too_few_steps(cli, tmp_path):
    r = cli("demo", "--out", str(tmp_path / "d"), "--steps", "10")
    assert r.returncode == 2 and "--steps" in r.stderr
    assert not (tmp_path / "d").exists()
