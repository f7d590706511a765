"""posenc.lab.progress: the compare progress display follows the tasks' events."""

from posenc.lab.progress import CompareProgress, InlineQueue


def test_progress_tracks_what_each_task_is_doing():
    p = CompareProgress(total_steps=20, schemes=["rope", "alibi"], enabled=False)
    p.handle(("step", "rope", 10, 2.5, 1000.0))
    p.handle(("eval", "alibi", None))
    assert p.steps == {"rope": 10, "alibi": 0}
    assert p.status == {"rope": "2.50 1,000tok/s", "alibi": "eval"}
    p.handle(("eval", "rope+pi", "64"))
    assert p.status["rope+pi"] == "eval 64"
    p.handle(("done", "rope", None))
    assert "rope" not in p.status
    p.close()


def test_progress_bar_counts_every_schemes_steps(capsys):
    p = CompareProgress(total_steps=40, schemes=["rope", "alibi"], enabled=True)
    p.handle(("step", "rope", 10, 2.5, 1000.0))
    p.handle(("step", "alibi", 10, 2.6, 900.0))
    p.handle(("step", "rope", 20, 2.0, 1000.0))
    assert p.bar.n == 30
    p.handle(("done", "alibi", "cached"))
    p.close()
    captured = capsys.readouterr()
    assert "alibi: already trained and evaluated, reusing" in captured.out + captured.err


def test_inline_queue_passes_events_straight_through():
    seen = []
    InlineQueue(seen.append).put(("done", "rope", None))
    assert seen == [("done", "rope", None)]
