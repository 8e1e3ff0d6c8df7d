"""The broker's refused PUBLISHes, read from its debug log: parsing, tailing, and one report per burst."""

from __future__ import annotations

from pathlib import Path

from corral.devices.refusals import Denial, LogTail, Refusals, parse_denial

# As Mosquitto 2.0.11 writes them (bench/broker_debug_log.py makes such lines on a real broker).
DENIED = "2026-12-02T08:09:40: Denied PUBLISH from lamp-1 (d0, q1, r0, m5, 'home/lock-1/event', ... (2 bytes))"


def test_a_denied_publish_names_the_client_and_the_topic() -> None:
    assert parse_denial(DENIED) == Denial("lamp-1", "home/lock-1/event")
    assert parse_denial("2026-12-02T08:09:40: Received PUBLISH from lamp-1 (d0, q1, r0, m5, 'home/lamp-1/event', "
                        "... (2 bytes))") is None
    assert parse_denial("2026-12-02T08:09:40: Sending PUBACK to lamp-1 (m5, rc135)") is None


def test_a_topic_is_device_text_made_safe() -> None:
    line = DENIED.replace("home/lock-1/event", "home/\u202eevil\u200b/event")
    assert parse_denial(line) == Denial("lamp-1", "home/evil/event")


def test_the_tail_reads_whole_new_lines_from_where_it_started(tmp_path: Path) -> None:
    path = tmp_path / "mosquitto-debug.log"
    path.write_text("old line before the controller started\n")
    tail = LogTail(path)
    assert tail.read() == [], "what was there before is not ours to tell"
    with open(path, "a") as log:
        log.write(DENIED + "\nhalf a li")
    assert tail.read() == [DENIED]
    with open(path, "a") as log:
        log.write("ne\n")
    assert tail.read() == ["half a line"]


def test_the_tail_cuts_the_log_once_read_past_its_bound_and_reads_on(tmp_path: Path) -> None:
    path = tmp_path / "mosquitto-debug.log"
    path.write_text("")
    tail = LogTail(path, max_bytes=200)
    tail.read()
    with open(path, "a") as log:  # as Mosquitto writes: appending, so a cut file is written on at its new end
        log.write((DENIED + "\n") * 3)
        log.flush()
        assert len(tail.read()) == 3
        assert path.stat().st_size == 0, "cut once read past 200 bytes"
        log.write(DENIED + "\n")
        log.flush()
        assert tail.read() == [DENIED]


def test_twenty_attempts_in_quick_succession_are_one_report_with_their_count() -> None:
    refusals = Refusals(quiet_s=2.0)
    reports = [refusals.add(Denial("lamp-1", f"home/lock-1/{kind}"), "lock-1", 0.1 * i)
               for i, kind in enumerate(["event", "ack", "info", "status"] * 5)]
    assert reports == [None] * 20, "nothing told while the burst goes on"
    assert refusals.tick(2.0) == []
    [report] = refusals.tick(4.0)
    assert (report.client, report.targets, report.burst.total) == ("lamp-1", {"lock-1": 20}, 20)
    assert report.words().startswith("Device lamp-1 tried to publish on lock-1's topics 20 times")
    assert refusals.tick(10.0) == [] and refusals.next_tick() is None


def test_a_long_attempt_is_told_each_minute_and_names_at_most_twenty_targets() -> None:
    refusals = Refusals(quiet_s=2.0)
    told = [r for i in range(130) for r in [refusals.add(Denial("x", f"t/{i}"), f"t/{i}", float(i))] if r]
    assert [r.burst.dropped for r in told] == [61, 60], "a count a minute while it lasts"
    assert len(told[0].targets) == 21 and told[0].targets["(other topics)"] == 41
    assert "other topics 41 times" in told[0].words()


def test_a_log_that_appears_later_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "mosquitto-debug.log"
    tail = LogTail(path)
    assert tail.read() == []
    path.write_text(DENIED + "\n")
    assert tail.read() == [DENIED]
