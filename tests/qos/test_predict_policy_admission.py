"""The transport's predictor, deadline policy and urgent admission, as plain logic."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from qos.admission import DEFAULT_RETRY_AFTER_S, HOLD_EWMA_ALPHA, Admission, Refused, Turns
from qos.policy import plan_site
from qos.predict import RECENT_CALLS, PathModel, PredictionLog, RecentMedian, SiteLoad, SiteModel
from services.reasons import codes
from tests.services.test_coordinator import poll_until

CLASSES = ["urgent", "routine", "teaching", "bulk"]


# ---------------------------------------------------------------- prediction

def test_path_model_recovers_rate_and_base_from_calls_of_several_sizes():
    model = PathModel()
    rng = np.random.default_rng(0)
    base, rate = 0.02, 1.25e6  # 20 ms, 10 Mbit/s
    for n in rng.integers(10_000, 2_000_000, 30):
        model.observe(int(n), base + n / rate)
    fit = model.fit()
    assert fit.base_s == pytest.approx(base, rel=1e-6)
    assert fit.rate_Bps == pytest.approx(rate, rel=1e-6)


def test_path_model_follows_a_change_of_rate_within_a_few_half_lives():
    model = PathModel()
    sizes = [100_000, 400_000, 1_600_000]
    for i in range(30):
        n = sizes[i % 3]
        model.observe(n, 0.01 + n / 1.25e6)
    for i in range(40):  # competing traffic arrives: a quarter of the rate
        n = sizes[i % 3]
        model.observe(n, 0.01 + n / 0.3125e6)
    assert model.fit().rate_Bps == pytest.approx(0.3125e6, rel=0.05)


def test_same_size_calls_keep_the_prior_rate_and_still_predict_that_size():
    model = PathModel(prior_rate_bps=100e6)
    for _ in range(10):
        model.observe(50_000, 0.3)
    fit = model.fit()
    assert fit.rate_Bps == pytest.approx(100e6 / 8)
    assert fit.transfer_s(50_000) == pytest.approx(0.3)


def test_one_stalled_transfer_does_not_lift_the_next_predictions():
    # On a loaded machine a ~5 ms loopback transfer now and then stalls for ~0.1 s; a mean
    # would carry it into the next ~8 predictions (APE ~100% each).
    model = PathModel(prior_rate_bps=100e6)
    for transfer_s in [0.005] * 6 + [0.12] + [0.005] * 2:
        model.observe(6_000, transfer_s)
    assert model.fit().transfer_s(6_000) == pytest.approx(0.005)
    for _ in range(RECENT_CALLS // 2 + 1):  # a new level is followed once it is the recent median
        model.observe(6_000, 0.03)
    assert model.fit().transfer_s(6_000) == pytest.approx(0.03)


def test_one_stalled_call_does_not_tilt_the_rate_of_a_path_carrying_two_sizes():
    # Features (~7 KB) and images (~900 KB) share a class's path; one stalled small call
    # must not make the big ones look fast (or slow).
    model = PathModel(prior_rate_bps=100e6)
    for i in range(12):
        n = (7_000, 900_000)[i % 2]
        model.observe(n, 0.003 + n / 100e6 * 8)
    model.observe(7_000, 0.15)  # stalled
    fit = model.fit()
    assert fit.transfer_s(7_000) == pytest.approx(0.003 + 7_000 / 100e6 * 8)
    assert fit.transfer_s(900_000) == pytest.approx(0.003 + 0.072)


def test_same_size_calls_faster_than_the_prior_rate_are_predicted_at_their_own_rate():
    # Loopback: ~900 KB in ~9 ms, eight times faster than the prior 100 Mbit/s allows;
    # keeping the prior rate would predict 72 ms.
    model = PathModel(prior_rate_bps=100e6)
    for _ in range(6):
        model.observe(900_000, 0.009)
    assert model.fit().transfer_s(900_000) == pytest.approx(0.009)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def answered(site, mode="features", cells=6, site_wall_s=0.030, queue_s=0.0, per_cell=0.002, workers=1,
             waiting_s=0.0, transfer_s=0.005, nbytes=10_000):
    """One answered call as the coordinator records it."""
    site.observe("routine", mode, nbytes, transfer_s, cells=cells, site_wall_s=site_wall_s, queue_s=queue_s,
                 load=SiteLoad(workers=workers, seconds_per_cell={mode: per_cell}, waiting_s=waiting_s,
                               at=site.clock()))


def test_site_model_predicts_transfer_overhead_and_service_from_measured_parts():
    site = SiteModel(clock=Clock())
    answered(site, site_wall_s=0.030, per_cell=0.002)  # 6 cells x 2 ms in one job, 18 ms of overhead
    assert site.site_parts("features", 6) == pytest.approx({"queue_s": 0.0, "overhead_s": 0.018, "service_s": 0.012})
    assert site.predict("routine", "features", 10_000, cells=6) == pytest.approx(0.005 + 0.030)
    assert site.predict("routine", "features", 10_000, cells=3) == pytest.approx(0.005 + 0.018 + 0.006)
    assert site.predict("routine", "images", 10_000, cells=6) is None  # never seen in that mode
    assert site.predict("urgent", "features", 10_000, cells=6) is None  # nor on that class's path


def test_a_cold_first_call_is_not_learnt_once_a_warm_one_is_known():
    # A fresh site's first call pays its process's lazy imports, its first search and the
    # channel's set-up (the demo's first case: 0.8 s at the site, 14 ms of transfer, against
    # ~0.03 s and 5 ms warm); the next cases must be predicted from the warm calls alone.
    site = SiteModel(clock=Clock())
    answered(site, site_wall_s=0.8, transfer_s=0.014)  # cold
    assert site.predict("routine", "features", 10_000, cells=6) == pytest.approx(0.014 + 0.8)  # all it knows
    answered(site, site_wall_s=0.030)
    assert site.predict("routine", "features", 10_000, cells=6) == pytest.approx(0.005 + 0.030)
    answered(site, site_wall_s=0.034)
    # the median of the warm calls (0.030, 0.034), not of all three, nor pulled by the cold one
    assert site.predict("routine", "features", 10_000, cells=6) == pytest.approx(0.005 + 0.032)


def test_a_recent_median_holds_its_first_value_apart():
    recent = RecentMedian()
    recent.add(0.8)
    assert recent.value() == 0.8
    recent.add(0.1)
    assert recent.value() == 0.1  # not (0.8 + 0.1) / 2
    recent.add(0.2)
    assert recent.value() == pytest.approx(0.15)


def test_images_are_served_by_every_worker_and_features_in_one_job():
    site = SiteModel(clock=Clock())
    answered(site, mode="images", site_wall_s=0.35, per_cell=0.1, workers=2)  # 3 rounds of 2 cells
    answered(site, mode="features", site_wall_s=0.02, per_cell=0.002, workers=2)
    assert site.site_parts("images", 6)["service_s"] == pytest.approx(0.3)
    assert site.site_parts("images", 6)["overhead_s"] == pytest.approx(0.05)
    assert site.site_parts("features", 6)["service_s"] == pytest.approx(0.012)


def test_the_queue_ahead_counts_as_reported_and_drains_with_time():
    clock = Clock()
    site = SiteModel(clock=clock)
    answered(site, site_wall_s=0.030, per_cell=0.002)
    idle = site.predict("routine", "features", 10_000, cells=6)
    answered(site, site_wall_s=1.030, queue_s=1.0, per_cell=0.002, waiting_s=1.5)  # a queue at the site
    assert site.overhead_s["features"].value() == pytest.approx(0.018)  # the wait is not taken for overhead
    assert site.predict("routine", "features", 10_000, cells=6) == pytest.approx(idle + 1.5)
    clock.now += 0.5
    assert site.queue_s() == pytest.approx(1.0)
    clock.now += 5
    assert site.predict("routine", "features", 10_000, cells=6) == pytest.approx(idle)


def test_a_class_is_predicted_behind_the_work_the_sites_dispatch_serves_before_it():
    # Bulk cells queued at the site start after a new urgent cell: urgent's wait leaves them out.
    clock = Clock()
    site = SiteModel(clock=clock)
    for cls in ("urgent", "bulk"):
        site.observe(cls, "features", 10_000, 0.005, cells=6, site_wall_s=0.030,
                     load=SiteLoad(seconds_per_cell={"features": 0.002}, at=clock()))
    idle = site.predict("urgent", "features", 10_000, cells=6)
    site.load = SiteLoad(seconds_per_cell={"features": 0.002}, waiting_s=4.0,
                         waiting_s_by_class={"urgent": 0.25, "bulk": 4.0}, at=clock())
    assert site.queue_s("urgent") == pytest.approx(0.25) and site.queue_s("bulk") == pytest.approx(4.0)
    assert site.predict("urgent", "features", 10_000, cells=6) == pytest.approx(idle + 0.25)
    assert site.predict("bulk", "features", 10_000, cells=6) == pytest.approx(idle + 4.0)
    assert site.site_parts("features", 6, "urgent")["queue_s"] == pytest.approx(0.25)
    clock.now += 1.0  # the queue drains meanwhile, each class's wait alike
    assert site.queue_s("urgent") == 0.0 and site.queue_s("bulk") == pytest.approx(3.0)


def test_a_site_that_reports_one_total_has_it_stand_for_every_class():
    clock = Clock()
    old = SiteLoad(waiting_s=2.0, at=clock())                                   # no field by class
    partial = SiteLoad(waiting_s=2.0, waiting_s_by_class={"bulk": 2.0}, at=clock())  # a class it does not know
    assert [old.ahead_s(c) for c in ("urgent", "bulk", None)] == [2.0, 2.0, 2.0]
    assert partial.ahead_s("urgent") == 2.0 and partial.ahead_s(None) == 2.0


def test_the_prediction_follows_a_change_of_service_time():
    site = SiteModel(clock=Clock())
    for _ in range(10):
        answered(site, mode="images", site_wall_s=0.61, per_cell=0.1)
    assert site.site_s("images", 6) == pytest.approx(0.61)
    # The site gets slower (another tenant, a bigger index): its report says so at once.
    answered(site, mode="images", site_wall_s=1.81, per_cell=0.3)
    assert site.site_s("images", 6) == pytest.approx(1.81)
    # A per-call cost that grows is learnt once it is the recent median; one slow call is not.
    answered(site, mode="images", site_wall_s=9.0, per_cell=0.3)
    assert site.site_s("images", 6) == pytest.approx(1.81)
    for _ in range(RECENT_CALLS // 2 + 1):
        answered(site, mode="images", site_wall_s=1.90, per_cell=0.3)
    assert site.site_s("images", 6) == pytest.approx(1.90)


def test_a_transfer_is_predicted_from_calls_made_under_about_the_same_concurrency():
    site = SiteModel(clock=Clock())

    def call(transfer_s, sharing):
        site.observe("routine", "features", 10_000, transfer_s, cells=6, site_wall_s=0.03, sharing=sharing,
                     load=SiteLoad(seconds_per_cell={"features": 0.002}, at=site.clock()))

    for _ in range(5):  # a burst: 20 of the coordinator's cases at once, 0.4 s each transfer
        call(0.4, sharing=20)
    # No lone call seen yet: the burst's calls, as if the path were shared equally.
    assert site.predict("routine", "features", 10_000, cells=6) == pytest.approx(0.4 / 20 + 0.03)
    assert site.predict("routine", "features", 10_000, cells=6, sharing=4) == pytest.approx(0.4 * 4 / 20 + 0.03)
    for _ in range(3):  # the burst is over
        call(0.05, sharing=1)
    assert site.predict("routine", "features", 10_000, cells=6) == pytest.approx(0.05 + 0.03)
    assert site.predict("routine", "features", 10_000, cells=6, sharing=15) == pytest.approx(0.4 + 0.03)


def test_recent_median_ignores_one_outlier_and_follows_a_new_level():
    recent = RecentMedian(window=5)
    assert recent.value() is None
    for value in [1.0, 1.0, 10.0, 1.0, float("nan")]:
        recent.add(value)
    assert recent.value() == 1.0
    for _ in range(3):
        recent.add(2.0)
    assert recent.value() == 2.0


def test_without_a_reported_service_time_the_wall_time_per_cell_stands_in():
    site = SiteModel(clock=Clock())
    site.observe("routine", "images", 10_000, 0.01, cells=4, site_wall_s=0.8)
    assert site.predict("routine", "images", 10_000, cells=4) == pytest.approx(0.01 + 0.8)


def test_prediction_log_reports_the_median_absolute_percentage_error():
    log = PredictionLog()
    assert log.mdape() is None
    for predicted, actual in [(1.1, 1.0), (0.8, 1.0), (1.0, 1.0), (2.0, 1.0), (1.05, 1.0)]:
        log.add(predicted, actual)
    assert log.mdape() == pytest.approx(0.1)
    assert log.add(None, 1.0) is None and len(log) == 5


# ---------------------------------------------------------------- policy

def fixed(predictions):
    return lambda cls, mode: predictions.get((cls, mode))


def test_features_go_where_the_schema_matches_and_images_elsewhere():
    same = plan_site("a", requested="routine", entitled=CLASSES, deadline_s=10, predict=fixed({}),
                     schema_matches=True)
    other = plan_site("b", requested="routine", entitled=CLASSES, deadline_s=10, predict=fixed({}),
                      schema_matches=False, ship="features")
    assert same.mode == "features" and other.mode == "images"
    assert codes(other.why)[0] == "images_other_schema_asked_features"


def test_urgent_steps_down_when_routine_meets_the_deadline_with_room_and_hedges_back_up():
    plan = plan_site("a", requested="urgent", entitled=CLASSES, deadline_s=10,
                     predict=fixed({("urgent", "features"): 0.5, ("routine", "features"): 0.6}),
                     schema_matches=True)
    assert plan.request_class == "routine" and plan.predicted_s == 0.6
    assert plan.hedge_class == "urgent"
    assert plan.hedge_after_s == pytest.approx(0.6 + 0.3)
    assert "class_stepped_down_within_deadline" in codes(plan.why)


def test_urgent_stays_when_routine_would_use_most_of_the_deadline():
    plan = plan_site("a", requested="urgent", entitled=CLASSES, deadline_s=2,
                     predict=fixed({("urgent", "features"): 0.5, ("routine", "features"): 1.5}),
                     schema_matches=True)
    assert plan.request_class == "urgent" and plan.hedge_class is None


def test_a_teacher_never_escalates_beyond_the_entitlement():
    teacher = ["teaching", "bulk"]
    plan = plan_site("a", requested="teaching", entitled=teacher, deadline_s=60,
                     predict=fixed({("teaching", "features"): 1.0}), schema_matches=True)
    assert plan.hedge_class is None and plan.request_class == "teaching"
    with pytest.raises(ValueError, match="not among"):
        plan_site("a", requested="urgent", entitled=teacher, deadline_s=60, predict=fixed({}),
                  schema_matches=True)


def test_routine_hedges_on_urgent_or_a_replica_when_nothing_is_above():
    routine = plan_site("a", requested="routine", entitled=CLASSES, deadline_s=10,
                        predict=fixed({("routine", "images"): 1.0}), schema_matches=False)
    assert routine.hedge_class == "urgent" and routine.hedge_after_s == pytest.approx(1.5)
    top = plan_site("a", requested="urgent", entitled=["urgent"], deadline_s=10,
                    predict=fixed({("urgent", "images"): 1.0}), schema_matches=False, replica="a2")
    assert top.hedge_site == "a2" and top.hedge_class is None


@pytest.mark.parametrize("deadline", [0, -1, float("nan")])
def test_a_deadline_must_be_positive(deadline):
    with pytest.raises(ValueError, match="deadline"):
        plan_site("a", requested="routine", entitled=CLASSES, deadline_s=deadline, predict=fixed({}),
                  schema_matches=True)


# ---------------------------------------------------------------- admission

class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_urgent_beyond_its_reservation_and_shared_room_is_served_as_routine():
    adm = Admission(CLASSES, capacity=4, reserved=2, class_share={"urgent": 0.5})
    tickets = [adm.admit("urgent", f"c{i}") for i in range(4)]
    assert [t.reserved for t in tickets] == [True, True, False, False]
    assert [t.served_as for t in tickets] == ["urgent", "urgent", "urgent", "routine"]
    assert tickets[3].reclassified and adm.reclassified == 1


def test_other_classes_cannot_take_the_reserved_share_and_get_a_retry_after():
    clock = Clock()
    adm = Admission(CLASSES, capacity=3, reserved=1, clock=clock)
    held = [adm.admit("teaching", "t1"), adm.admit("bulk", "t2")]
    with pytest.raises(Refused) as refused:
        adm.admit("teaching", "t3")
    assert refused.value.retry_after_s > 0
    assert adm.admit("urgent", "u").reserved  # the reserved slot is still there
    clock.now = 4.0
    adm.release(held[0])
    assert adm.admit("teaching", "t3").served_as == "teaching"
    with pytest.raises(Refused) as again:
        adm.admit("teaching", "t4")  # the reserved slot and both shared ones are in use
    assert again.value.retry_after_s == pytest.approx(4.0)


def test_a_class_share_stops_a_burst_of_one_class_taking_every_shared_slot():
    adm = Admission(CLASSES, capacity=5, reserved=1, class_share={"teaching": 0.5})
    adm.admit("teaching", "a"), adm.admit("teaching", "b")
    with pytest.raises(Refused):
        adm.admit("teaching", "c")
    assert adm.admit("routine", "d").served_as == "routine"


def test_one_client_cannot_fill_a_class():
    adm = Admission(CLASSES, capacity=10, reserved=2, per_client=2)
    first = adm.admit("routine", "greedy")
    adm.admit("routine", "greedy")
    with pytest.raises(Refused, match="this client"):
        adm.admit("routine", "greedy")
    assert adm.admit("routine", "other").client == "other"
    adm.release(first)
    adm.release(first)  # idempotent
    assert adm.admit("routine", "greedy").served_as == "routine"
    assert adm.in_use() == 3


def test_a_retry_after_follows_the_served_classs_holding_times_and_refusals_count_by_the_class_asked():
    clock = Clock()
    adm = Admission(CLASSES, capacity=2, reserved=1, clock=clock)
    for held_s in (10.0, 20.0):
        ticket = adm.admit("teaching", "t")
        clock.now += held_s
        adm.release(ticket)
    adm.admit("teaching", "t"), adm.admit("urgent", "u")  # the shared slot, the reserved one
    with pytest.raises(Refused) as teaching:
        adm.admit("teaching", "t2")
    assert teaching.value.retry_after_s == pytest.approx(10.0 + HOLD_EWMA_ALPHA * (20.0 - 10.0))
    with pytest.raises(Refused) as urgent:  # past its reservation, and routine has no room either
        adm.admit("urgent", "u2")
    assert urgent.value.retry_after_s == DEFAULT_RETRY_AFTER_S  # routine has held nothing yet
    assert adm.refused == {"teaching": 1, "urgent": 1} and adm.reclassified == 0


@pytest.mark.parametrize("capacity, reserved", [(0, 0), (2, 2), (2, -1)])
def test_a_reservation_needs_a_shared_slot_beside_it(capacity, reserved):
    with pytest.raises(ValueError):
        Admission(CLASSES, capacity=capacity, reserved=reserved)


def test_an_unknown_class_is_not_admitted_and_takes_no_slot():
    adm = Admission(CLASSES, capacity=2)
    with pytest.raises(ValueError):
        adm.admit("vip", "c")
    assert adm.in_use() == 0 and adm.refused == {}



def _wait_in_turn(turns: Turns, priority: int, label: str, order: list, hold: threading.Event | None = None):
    """A thread that takes a turn at `priority`, notes `label` in `order` when it has it, and
    keeps it until `hold` is set; returned once it is waiting (or holding)."""
    def take():
        with turns.turn(priority):
            order.append(label)
            if hold is not None:
                hold.wait(30)

    before = turns.waiting()
    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    poll_until(lambda: turns.waiting() > before or label in order, 10, f"{label} waiting for its turn")
    return thread


def test_turns_go_to_the_most_favoured_waiter_first_and_in_arrival_order_within_a_class():
    turns, order = Turns(), []
    with turns.turn(3):  # held: everyone below waits
        threads = [_wait_in_turn(turns, priority, label, order)
                   for priority, label in ((3, "bulk"), (0, "urgent-1"), (2, "teaching"), (0, "urgent-2"),
                                           (1, "routine"))]
        assert turns.waiting() == 5 and order == []
    for thread in threads:
        thread.join(10)
    assert order == ["urgent-1", "urgent-2", "routine", "teaching", "bulk"]
    assert turns.waiting() == 0


def test_turns_let_width_holders_in_at_once_and_no_more():
    turns, order, hold = Turns(width=2), [], threading.Event()
    holders = [_wait_in_turn(turns, 1, f"holder-{i}", order, hold) for i in range(2)]
    assert order == ["holder-0", "holder-1"] and turns.waiting() == 0
    third = _wait_in_turn(turns, 0, "third", order)
    assert turns.waiting() == 1 and "third" not in order
    hold.set()
    for thread in (*holders, third):
        thread.join(10)
    assert order[-1] == "third" and turns.waiting() == 0
    with pytest.raises(ValueError):
        Turns(width=0)


def test_a_recent_level_is_the_median_of_like_cases_under_about_the_same_concurrency():
    from qos.predict import RECENT_CASES, RecentLevel

    levels = RecentLevel()
    levels.add("features/6", 0.10)
    levels.add("features/6", 0.30)
    assert levels.value("features/6") is None  # fewer than 3: the model speaks instead
    levels.add("features/6", 0.12)
    assert levels.value("features/6") == pytest.approx(0.12)  # the slow one does not pull it
    for _ in range(3):
        levels.add("features/6", 2.0, sharing=20)  # a burst of 20 cases at once
    assert levels.value("features/6") == pytest.approx(0.12)  # a lone case is not predicted from the burst
    assert levels.value("features/6", sharing=15) == pytest.approx(2.0)
    assert levels.value("images/6") is None
    for _ in range(RECENT_CASES // 2 + 1):
        levels.add("features/6", 0.5)  # a new level
    assert levels.value("features/6") == pytest.approx(0.5)


def test_a_calibration_is_the_recent_median_ratio_of_actual_to_modelled():
    from qos.predict import Calibration

    calibration = Calibration()
    assert calibration.factor("features") == 1.0  # nothing known: the model as it is
    for actual in (0.15, 0.15, 0.9):
        calibration.add("features", actual, 0.1)
    assert calibration.factor("features") == pytest.approx(1.5)
    calibration.add("features", 1.0, None)  # no model then: ignored
    assert calibration.factor("features") == pytest.approx(1.5)


def test_a_site_call_is_predicted_from_its_own_recent_calls_the_model_rated_alike():
    # A site's call time is the transfer plus the site's work; when the two move against each
    # other (a slow transfer with a quick search, then the reverse) the sum of their medians
    # is not the median of the whole. Three or more calls the model rated alike predict the
    # next one by their median; a call the model rates differently gets the model's sum.
    clock = Clock()
    site = SiteModel(clock=clock)
    calls = [(0.030, 0.060), (0.005, 0.060), (0.030, 0.040), (0.005, 0.060), (0.030, 0.040), (0.030, 0.060)]
    for transfer_s, wall_s in calls:
        answered(site, transfer_s=transfer_s, site_wall_s=wall_s)
    whole = float(np.median([t + w for t, w in calls]))
    modelled = site.modelled_s("routine", "features", 10_000, cells=6)
    assert abs(modelled - whole) > 0.01  # the two differ here, so the test can tell them apart
    assert site.predict("routine", "features", 10_000, cells=6) == pytest.approx(whole)
    # A call of 10x the bytes is modelled more than 1.5x longer: none of the calls is alike.
    bigger = site.modelled_s("routine", "features", 10_000_000, cells=6)
    assert bigger > 1.5 * modelled
    assert site.predict("routine", "features", 10_000_000, cells=6) == pytest.approx(bigger)
    # The queue the site reports now comes on top of the level (the level is of calls less their queue).
    answered(site, transfer_s=0.006, site_wall_s=1.060, queue_s=1.0, waiting_s=2.0)
    level = float(np.median([t + w for t, w in calls[-4:]] + [0.006 + 0.060]))
    assert site.predict("routine", "features", 10_000, cells=6) == pytest.approx(site.queue_s() + level)
    assert site.queue_s() == pytest.approx(2.0)


def test_a_case_is_predicted_by_like_cases_once_three_are_known_else_by_its_slowest_site_calibrated():
    from qos.predict import CaseModel

    cases, planned = CaseModel(), ["features"] * 3
    assert cases.predict(planned, 6, 0.0, [0.1, None, 0.2]) == (None, None)  # a site not predictable yet
    predicted, modelled = cases.predict(["features"] * 3, 6, 0.05, [0.10, 0.20, 0.15])
    assert predicted == modelled == pytest.approx(0.05 + 0.20)  # the analysis, then the slowest site
    cases.observe(planned, ["features", "features", "images"], 6, total_s=9.0, modelled_s=0.25)  # a site fell back
    assert cases.predict(planned, 6, 0.05, [0.10, 0.20, 0.15])[0] == pytest.approx(0.25)  # not learnt
    cases.observe(planned, planned, 6, total_s=0.50, modelled_s=0.25)  # took twice as long as modelled
    predicted, modelled = cases.predict(["features"] * 3, 6, 0.05, [0.10, 0.20, 0.15])
    assert predicted == pytest.approx(0.50)  # calibrated by the ratio 2
    for total in (0.40, 0.30):
        cases.observe(planned, planned, 6, total_s=total, modelled_s=0.25)
    assert cases.predict(["features"] * 3, 6, 0.05, [0.10, 0.20, 0.15])[0] == pytest.approx(0.40)  # the median
    # Another kind of case (a site sent images), or another size, has levels of its own.
    assert cases.predict(["features", "features", "images"], 6, 0.05, [0.1, 0.2, 0.9])[0] == pytest.approx(0.95)
    assert cases.predict(["features"] * 3, 12, 0.05, [0.10, 0.20, 0.15])[0] == pytest.approx(0.25 * 1.6)


def test_a_case_is_predicted_from_like_cases_of_its_own_class():
    """Under load an urgent case overtakes the bulk ones: their times are not its."""
    from qos.predict import CaseModel

    cases, planned = CaseModel(), ["features"] * 3
    for urgent_s, bulk_s in ((0.4, 20.0), (0.5, 22.0), (0.6, 24.0)):
        cases.observe(planned, planned, 1, total_s=urgent_s, modelled_s=0.5, request_class="urgent")
        cases.observe(planned, planned, 1, total_s=bulk_s, modelled_s=0.5, request_class="bulk")
    assert cases.predict(planned, 1, 0.05, [0.45], request_class="urgent")[0] == pytest.approx(0.5)
    assert cases.predict(planned, 1, 0.05, [0.45], request_class="bulk")[0] == pytest.approx(22.0)
    # A class with no case yet: its modelled time, calibrated by its own cases only (none: 1).
    assert cases.predict(planned, 1, 0.05, [0.45], request_class="routine")[0] == pytest.approx(0.5)


def test_a_call_is_predicted_with_the_reply_bytes_the_site_has_been_sending():
    from qos.predict import Predictor

    predictor = Predictor(clock=Clock())
    assert predictor.call_bytes("A", 2_000, cells=6) == 2_000  # nothing known of its replies
    predictor.observe("A", request_class="routine", mode="features", request_bytes=2_000, reply_bytes=6_000,
                      elapsed_s=0.040, cells=6, site_wall_s=0.030)
    assert predictor.call_bytes("A", 2_000, cells=6) == 2_000 + 6_000
    assert predictor.call_bytes("A", 2_000, cells=3) == 2_000 + 3_000  # per cell
    predictor.observe("A", request_class="routine", mode="features", request_bytes=2_000, reply_bytes=12_000,
                      elapsed_s=0.040, cells=6, site_wall_s=0.030)
    assert predictor.call_bytes("A", 0, cells=1) == int(1_000 + 0.3 * (2_000 - 1_000))  # follows, smoothed
    assert predictor.call_bytes("B", 2_000, cells=6) == 2_000  # per site
    # The transfer it learnt is the call's wall time less the site's.
    assert predictor.site("A").path("routine").fit().transfer_s(14_000) == pytest.approx(0.010)
