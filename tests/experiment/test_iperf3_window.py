"""Which of a competing flow's iperf3 intervals belong to a run's case (runner.iperf3_of_run).

iperf3's start stamp has whole seconds and precedes its streams' connections; on a busy
machine the two together put a short case outside the slack and a run kept no intervals.
The intervals are dated from the moment the flows were stopped less the report's duration.
"""

from __future__ import annotations

from qos.experiment.runner import IPERF3_SLACK_S, iperf3_of_run, iperf3_origin
from qos.traffic.competing import TrafficResult


def report(timesecs: int, seconds: float) -> dict:
    """An interrupted iperf3 -J report: per-second intervals, the last one partial."""
    edges = [float(i) for i in range(int(seconds) + 1)] + [seconds]
    intervals = [{"sum": {"start": a, "end": b, "bytes": 1000}} for a, b in zip(edges, edges[1:]) if b > a]
    return {"start": {"timestamp": {"timesecs": timesecs}}, "intervals": intervals,
            "end": {"sum_received": {"seconds": seconds, "bytes": 1000 * len(intervals)}}}


def test_the_origin_is_the_stop_less_the_reports_duration():
    data = report(timesecs=1000, seconds=12.4)
    assert iperf3_origin(data, stopped_epoch=1016.9) == 1016.9 - 12.4
    assert iperf3_origin(data, stopped_epoch=0.0) == 1000  # no stop time: iperf3's own stamp


def test_a_case_in_the_last_partial_second_keeps_its_intervals_however_late_the_streams_connected():
    # The streams connected 3.5 s after iperf3's (truncated) start stamp: more than the slack.
    started, connect_s, seconds = 1000, 3.5, 12.4
    stopped = started + connect_s + seconds
    case = (stopped - 0.3, stopped - 0.05)  # the block's last case, in the partial last interval
    result = TrafficResult("downloads", 8, 12400, seconds, [], {"A1->B3": {"client": report(started, seconds)}},
                           stopped_epoch=stopped)
    kept = iperf3_of_run(result, case)["flows"]["A1->B3"]["client"]["intervals"]
    assert kept and kept[-1]["sum"]["end"] == seconds  # the partial interval the case ran in
    assert all(iv["sum"]["end"] > seconds - 0.3 - IPERF3_SLACK_S for iv in kept)
    # Dated by iperf3's stamp alone, the same case would have kept nothing.
    result.stopped_epoch = 0.0
    assert iperf3_of_run(result, case)["flows"]["A1->B3"]["client"]["intervals"] == []
