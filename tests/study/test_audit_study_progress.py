"""study progress: every point is announced before it runs and its steps are counted while it runs."""

from __future__ import annotations

from fabricpace.study.runner import StudyPlan, run_study


def test_progress_names_the_point_that_is_running(tmp_path):
    # The CLI showed the label that run_study passes after a point while the next point ran: the bar
    # said "1 nodes baseline #1" for the whole of "1 nodes paced #1". Now every point is announced
    # before it runs, and its steps are counted while it runs.
    plan = StudyPlan(backend="sim", nodes=(1, 2), modes=("baseline", "paced"), repeats=1, steps=12,
                     warmup=2, seed=1, out_dir=tmp_path / "s", cluster="single-switch",
                     workload="resnet-50")
    events: list[tuple[str, object]] = []

    def starting(label: str) -> None:
        nodes, mode = int(label.split()[1]), label.split()[3]
        run_dir = plan.out_dir / "runs" / f"sim-n{nodes}-{mode}-r0"
        events.append(("start", (label, run_dir.exists())))

    run_study(plan, starting=starting, progress=lambda label: events.append(("done", label)),
              steps_done=lambda n: events.append(("steps", n)))
    starts = [e[1] for e in events if e[0] == "start"]
    assert starts == [(f"sim {n} nodes {m} #1", False) for n in (1, 2) for m in ("baseline", "paced")]
    # between a start and its done: that point's steps, all of them, then the same label
    i = 0
    for label, _ in starts:
        assert events[i] == ("start", (label, False))
        j = events.index(("done", label), i)
        assert sum(n for kind, n in events[i + 1 : j] if kind == "steps") == plan.steps
        i = j + 1
