"""The real run's timeline figures (``bench/realrun.py``): the relay's tail starts at the last
task that moves jobs, whether or not ``persist`` ran (issue #29: it is skipped when classify left
it nothing), and the hand-offs around the classification are read from the same timeline."""

from __future__ import annotations

from bench.realrun import hand_offs, relay_tail

WITH_PERSIST = {
    "retrieve[0]": [0.8, 5.0],
    "retrieve[1]": [0.9, 5.2],
    "size_classify": [5.6, 6.0],
    "classify[0]": [6.4, 16.0],
    "classify[1]": [6.4, 16.5],
    "persist": [17.0, 17.4],
    "publish_events": [17.9, 22.0],
    "alert": [22.4, 22.8],
}
WITHOUT_PERSIST = {name: span for name, span in WITH_PERSIST.items() if name not in ("persist", "alert")}


def test_the_relay_tail_starts_at_persists_end_when_it_ran() -> None:
    assert relay_tail(WITH_PERSIST) == 22.0 - 17.4


def test_the_relay_tail_starts_at_the_last_classify_end_when_persist_was_skipped() -> None:
    assert relay_tail(WITHOUT_PERSIST) == 22.0 - 16.5


def test_a_timeline_without_publish_events_has_no_relay_tail() -> None:
    assert relay_tail({"classify[0]": [1.0, 2.0]}) == 0.0


def test_hand_offs_are_the_gaps_around_the_classification() -> None:
    assert hand_offs(WITH_PERSIST, 23.0) == {
        "retrieve_to_classify": 1.2,
        "classify_to_publish": 1.4,  # persist and the hand-offs either side of it
        "publish_to_run_end": 1.0,
    }
    assert hand_offs(WITHOUT_PERSIST, 22.3) == {
        "retrieve_to_classify": 1.2,
        "classify_to_publish": 1.4,
        "publish_to_run_end": 0.3,
    }


def _task_instance(task_id: str, map_index: int, queued: str, start: str, end: str) -> dict[str, object]:
    day = "2026-12-05T21:00:"
    return {
        "task_id": task_id,
        "map_index": map_index,
        "try_number": 1,
        "queued_when": day + queued + "Z",
        "start_date": day + start + "Z",
        "end_date": day + end + "Z",
    }


def _log(*marks: tuple[str, str]) -> dict[str, object]:
    head = [{"event": "::group::Log message source details"}, {"event": "/logs/attempt=1.log"}]
    return {"content": head + [{"timestamp": f"2026-12-05T21:00:{at}Z", "event": event} for at, event in marks]}


def test_a_tasks_start_up_is_read_from_its_record_and_its_logs_marks() -> None:
    """Queued at 10.0, started (forked, told the API server) at 10.2, ``execute`` from 10.7 to
    11.5, ended at 11.6; a task the scheduler skipped (no process) has no start-up."""
    import httpx

    from bench.realrun import start_up_seconds, task_start_ups

    instances = [
        _task_instance("size_classify", -1, "10.000", "10.200", "11.600"),
        _task_instance("classify", 0, "12.000", "12.100", "20.000"),
        _task_instance("classify", 1, "12.000", "12.300", "19.000"),
        {
            "task_id": "persist",
            "map_index": -1,
            "try_number": 0,
            "queued_when": None,
            "start_date": None,
            "end_date": None,
        },
    ]
    logs = {
        ("size_classify", "-1"): _log(
            ("10.250", "::group::Pre Execute"),
            ("10.500", "Worker startup parse complete"),
            ("10.700", "::endgroup::"),
            ("11.500", "::group::Post Execute"),
            ("11.550", "::endgroup::"),
        ),
        ("classify", "0"): _log(
            ("12.150", "::group::Pre Execute"), ("12.400", "::endgroup::"), ("19.900", "::group::Post Execute")
        ),
        ("classify", "1"): _log(
            ("12.350", "::group::Pre Execute"), ("12.900", "::endgroup::"), ("18.900", "::group::Post Execute")
        ),
    }

    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/taskInstances"):
            return httpx.Response(200, json={"task_instances": instances})
        task_id = path.split("/taskInstances/")[1].split("/")[0]
        return httpx.Response(200, json=logs[(task_id, request.url.params["map_index"])])

    with httpx.Client(base_url="http://api", transport=httpx.MockTransport(answer)) as api:
        start_ups = task_start_ups(api, "bench__2026-11-02__1")
    assert set(start_ups) == {"size_classify", "classify[0]", "classify[1]"}
    assert start_ups["size_classify"] == {
        "queued_to_start": 0.2,
        "start_to_execute": 0.5,
        "execute": 0.8,
        "after_execute": 0.1,
        "start_up": 0.7,
    }
    # The run waited for each task's slowest instance: 0.7 + 0.9.
    assert start_up_seconds(start_ups) == 1.6
