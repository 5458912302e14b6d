"""The fleet simulator of ``capacity`` (issue 50, point 4) against cases whose answer is derived by
hand, the traffic profile and price table it reads (each bad value refused in one line naming the
field), and the search for the cheapest fleet."""

from __future__ import annotations

from typing import Any, cast

import pytest

from triton_mme_cdk.model_build.capacity.fleet import Requests, Target, search
from triton_mme_cdk.model_build.capacity.prices import parse_prices
from triton_mme_cdk.model_build.capacity.simulate import (
    DEFAULT_ROUTING,
    FleetResult,
    InstanceShape,
    ModelLoad,
    Routing,
    percentile,
    simulate,
)
from triton_mme_cdk.model_build.capacity.traffic import CapacityInputError, draw_requests, parse_profile


def _ran(row: Any) -> FleetResult:
    """The simulated result of a search row (a skipped or does-not-fit row has none)."""
    assert row.result is not None, row
    return cast(FleetResult, row.result)


def _warm(row: Any) -> float:
    """A search row's simulated warm share (none when nothing was counted)."""
    share = _ran(row).warm_share
    assert share is not None, row
    return share


def models(*names: str, size: int = 10, load: float = 2.0, fetch: float = 0.0, service: float = 0.001) -> list[ModelLoad]:
    return [ModelLoad(name, size, size, load, fetch, service) for name in names]


def run(loads: list[ModelLoad], sequence: str, *, gpu: int, disk: int = 10**6, count: int = 1, gap: float = 10.0,
        warmup: float = 0.0, routing: Routing = DEFAULT_ROUTING):
    """One request every ``gap`` seconds, for the models named by the letters of ``sequence``."""
    index = {m.name: i for i, m in enumerate(loads)}
    times = [i * gap for i in range(len(sequence))]
    return simulate(loads, InstanceShape("ml.test", gpu, disk), count, times, [index[c] for c in sequence],
                    warmup_seconds=warmup, routing=routing)


# ---------------------------------------------------------------------------------------------
# Hand-computed cases
# ---------------------------------------------------------------------------------------------


def test_everything_fits_so_every_request_after_the_warm_up_is_warm() -> None:
    # Three models of 10 bytes on 30 bytes: each loads once (requests 0..2, inside the warm-up).
    result = run(models("a", "b", "c"), "abc" + "cab" * 10, gpu=30, warmup=25.0)
    assert (result.requests, result.warm, result.loads, result.waited) == (30, 30, 0, 0)
    assert result.warm_share == 1.0 and result.loads_per_minute == 0.0
    assert result.resident_models == ["a", "b", "c"] and result.peak_gpu_bytes == 30


def test_room_for_one_and_two_alternating_models_loads_on_every_request() -> None:
    result = run(models("a", "b", load=2.0), "ab" * 10, gpu=10)
    assert (result.requests, result.warm, result.loads, result.waited) == (20, 0, 20, 20)
    assert result.waits == [2.0] * 20 and result.wait_p99_seconds == 2.0
    # 20 loads in the 190 s from the first request to the last.
    assert result.loads_per_minute == pytest.approx(20 * 60 / 190)
    assert result.resident == [["b"]]


def test_lru_evicts_the_least_recently_used_not_the_first_loaded() -> None:
    loads = models("a", "b", "c")
    # Room for two. a b a c: c evicts b (a was used after b); then b evicts a (c is newer).
    result = run(loads, "abacb", gpu=20)
    assert result.loads == 4  # a, b, c, b again
    assert result.warm == 1  # the second a
    assert result.resident == [["c", "b"]]
    # a b c a: c evicts a, the least recently used; a then evicts b.
    result = run(loads, "abca", gpu=20)
    assert result.loads == 4 and result.warm == 0 and result.resident == [["c", "a"]]


def test_a_model_too_hot_to_evict_stays_while_the_cold_ones_churn() -> None:
    # Room for two; h every other request, c1..c4 in turn between: h is never the LRU.
    loads = models("h", "1", "2", "3", "4")
    result = run(loads, "h1h2h3h4" * 5, gpu=20, warmup=5.0)
    assert result.requests == 39
    assert result.warm == 19  # every h after the first
    assert result.loads == 20  # every cold request
    assert all(resident[0] == "h" or "h" in resident for resident in result.resident)


def test_the_disk_is_a_cache_too_a_model_on_it_loads_without_a_download() -> None:
    loads = models("a", "b", load=2.0, fetch=3.0)
    small = run(loads, "ab" * 5, gpu=10, disk=10)  # the disk holds one: every load downloads
    assert small.downloads == small.loads == 10 and set(small.waits) == {5.0}
    big = run(loads, "ab" * 5, gpu=10, disk=20)  # both stay on disk after their first download
    assert big.downloads == 2 and big.loads == 10
    assert big.waits == [5.0, 5.0] + [2.0] * 8


def test_requests_during_a_load_wait_for_it_and_count_once() -> None:
    # The load of a starts at t=0 and ends at t=5: the requests at 0, 2 and 4 wait 5, 3 and 1 s.
    result = run(models("a", load=5.0), "aaaa", gpu=10, gap=2.0)
    assert result.loads == 1 and result.waited == 3 and result.warm == 1
    assert result.waits == [5.0, 3.0, 1.0] and result.waited_share == 0.75


def test_a_wait_over_the_invoke_limit_is_not_ready() -> None:
    result = run(models("a", "b", load=70.0), "ab", gpu=10, gap=100.0)
    assert result.not_ready == 2 and result.waited == 2
    result = run(models("a", "b", load=70.0), "ab", gpu=10, gap=100.0, routing=Routing(invoke_timeout_seconds=80))
    assert result.not_ready == 0


def test_a_busy_model_spills_to_another_instance_and_loads_there() -> None:
    # One model, service 1 s, a request every 0.1 s: after one request the instance has 0.9 s queued.
    loads = models("h", service=1.0)
    spilled = run(loads, "h" * 5, gpu=10, count=2, gap=0.1)
    assert spilled.spilled >= 1 and spilled.loads == 2
    assert spilled.resident == [["h"], ["h"]]
    single = run(loads, "h" * 5, gpu=10, count=1, gap=0.1)
    assert single.spilled == 0 and single.loads == 1
    patient = run(loads, "h" * 5, gpu=10, count=2, gap=0.1, routing=Routing(spill_after_seconds=100.0))
    assert patient.spilled == 0 and patient.resident == [["h"], []]


def test_cold_models_go_to_the_idle_instances_in_turn() -> None:
    result = run(models("a", "b", "c", "d"), "abcd", gpu=10, count=4, gap=0.0)
    assert result.resident == [["a"], ["b"], ["c"], ["d"]]
    assert result.loads == 4


def test_a_model_larger_than_the_gpu_is_never_answered() -> None:
    loads = [*models("a"), ModelLoad("b", 50, 50, 1.0)]
    result = run(loads, "abab", gpu=10)
    assert result.unfit == 2 and result.warm == 1 and result.loads == 1


def test_percentile_is_the_nearest_rank() -> None:
    assert percentile([], 0.99) == 0.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0


# ---------------------------------------------------------------------------------------------
# Traffic
# ---------------------------------------------------------------------------------------------

GROUPS = {"a": ["a"], "b": ["b"], "r": ["r-0", "r-1"]}


def test_the_default_profile_is_zipf_one_at_ten_requests_per_second_in_manifest_order() -> None:
    traffic = parse_profile(None, GROUPS)
    harmonic = 1 + 1 / 2 + 1 / 3 + 1 / 4
    assert traffic.total == pytest.approx(10.0)
    assert traffic.rates == pytest.approx({"a": 10 / harmonic, "b": 5 / harmonic, "r-0": 10 / 3 / harmonic,
                                           "r-1": 2.5 / harmonic})


def test_a_zipf_order_puts_the_named_models_first() -> None:
    traffic = parse_profile({"total_rate": 3, "zipf": 0, "order": ["r"]}, GROUPS)
    assert traffic.rates == pytest.approx({"r-0": 0.75, "r-1": 0.75, "a": 0.75, "b": 0.75})
    traffic = parse_profile({"total_rate": 7, "zipf": 1, "order": ["b"]}, GROUPS)
    assert max(traffic.rates, key=traffic.rates.__getitem__) == "b"


def test_per_model_rates_split_an_entry_over_its_copies_and_leave_the_rest_at_zero() -> None:
    traffic = parse_profile({"rates": {"r": 4, "a": 1.5}, "service_ms": {"a": 3}}, GROUPS)
    assert traffic.rates == {"a": 1.5, "b": 0.0, "r-0": 2.0, "r-1": 2.0}
    assert traffic.service_ms == {"a": 3.0}


@pytest.mark.parametrize(("data", "field"), [
    ({"rates": {"nope": 1}}, "traffic.rates.nope: got 'nope'; no such model"),
    ({"rates": {"a": -1}}, "traffic.rates.a: got -1; expected requests per second"),
    ({"rates": {"a": "fast"}}, "traffic.rates.a: got 'fast'; expected requests per second"),
    ({"rates": {"a": True}}, "traffic.rates.a: got True"),
    ({"zipf": 4.5}, "traffic.zipf: got 4.5; expected a Zipf exponent in [0, 4]"),
    ({"zipf": -0.1}, "traffic.zipf: got -0.1"),
    ({"zipf": "steep"}, "traffic.zipf: got 'steep'"),
    ({"total_rate": 0}, "traffic.total_rate: got 0"),
    ({"total_rate": float("nan")}, "traffic.total_rate: got nan"),
    ({"rates": {"a": 1}, "zipf": 1}, "traffic.zipf: given with traffic.rates"),
    ({"order": ["zz"]}, "traffic.order[0]: got 'zz'; no such model"),
    ({"rate": 3}, "traffic.rate: unknown field"),
    ({"rates": {"a": 0}}, "traffic.rates: every rate is 0"),
    ({"service_ms": {"a": 0}}, "traffic.service_ms.a: got 0"),
    ([1, 2], "traffic: got list"),
])
def test_a_bad_profile_is_refused_in_one_line_naming_the_field(data: object, field: str) -> None:
    with pytest.raises(CapacityInputError) as raised:
        parse_profile(data, GROUPS)
    assert str(raised.value).startswith(field) and "\n" not in str(raised.value)


def test_the_requests_repeat_with_the_seed_and_follow_the_rates() -> None:
    first = draw_requests([3.0, 1.0, 0.0], seconds=2000.0, seed=7)
    assert first == draw_requests([3.0, 1.0, 0.0], seconds=2000.0, seed=7)
    assert first != draw_requests([3.0, 1.0, 0.0], seconds=2000.0, seed=8)
    times, targets = first
    assert times == sorted(times) and times[-1] < 2000.0
    assert len(times) == pytest.approx(8000, rel=0.05)  # 4 per second
    assert targets.count(2) == 0
    assert targets.count(0) / len(targets) == pytest.approx(0.75, abs=0.02)


# ---------------------------------------------------------------------------------------------
# Prices
# ---------------------------------------------------------------------------------------------

PRICES = {"date": "2026-11-27", "source": "a test", "per_hour": {"ml.big": 3.0, "ml.small": 1.0}}


@pytest.mark.parametrize(("change", "field"), [
    ({"date": None}, "prices.date: got None; a price table must say when"),
    ({"source": ""}, "prices.source: got ''; a price table must say where"),
    ({"per_hour": {"ml.small": -1}}, "prices.per_hour.ml.small: got -1"),
    ({"per_hour": {"ml.nope": 1}}, "prices.per_hour.ml.nope: unknown instance type"),
    ({"verified": "yes"}, "prices.verified: got 'yes'"),
])
def test_a_bad_price_table_is_refused_naming_the_field(change: dict, field: str) -> None:
    data = {k: v for k, v in {**PRICES, **change}.items() if v is not None}
    with pytest.raises(CapacityInputError) as raised:
        parse_prices(data, known=("ml.big", "ml.small"))
    assert str(raised.value).startswith(field)


def test_an_unverified_table_says_so_in_its_label() -> None:
    table = parse_prices(PRICES)
    assert "UNVERIFIED" in table.label() and "2026-11-27" in table.label() and "a test" in table.label()
    assert "UNVERIFIED" not in parse_prices({**PRICES, "verified": True}).label()


# ---------------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------------


def test_the_cheapest_fleet_that_meets_the_target_is_found() -> None:
    # Four equally hot models of 10 bytes, one request each in turn. ml.small holds 20 bytes (18
    # with 10% slack: one model), so it needs four instances (4.0 an hour); ml.big holds 50 (45:
    # all four) and one (3.0) keeps them warm. ml.huge (9.0) costs more than that: skipped;
    # ml.tiny (5 bytes) fits no model.
    loads = models("a", "b", "c", "d", service=0.0001)
    times = [i * 0.5 for i in range(4000)]
    requests = Requests(times, [i % 4 for i in range(4000)], warmup_seconds=10.0, seed=0, seconds=2000.0)
    shapes = [InstanceShape("ml.small", 20, 10**6), InstanceShape("ml.big", 50, 10**6),
              InstanceShape("ml.tiny", 5, 10**6), InstanceShape("ml.huge", 500, 10**6)]
    prices = parse_prices({**PRICES, "per_hour": {"ml.small": 1.0, "ml.big": 3.0, "ml.huge": 9.0}})
    rows, best = search(loads, shapes, requests, prices=prices, max_count=5)
    assert best is not None and (best.instance_type, best.count, best.cost_per_hour) == ("ml.big", 1, 3.0)
    table = {(row.instance_type, row.count): row for row in rows}
    # ml.small: 1 misses, 5 meets, then by bisection 3 misses and 4 meets. ml.big: at most 1 costs
    # less than 4.0.
    assert [(row.count, row.meets_target) for row in rows if row.instance_type == "ml.small"] == [
        (1, False), (3, False), (4, True), (5, True)]
    assert _warm(table[("ml.small", 3)]) < 0.99
    assert _warm(table[("ml.small", 4)]) == 1.0 and table[("ml.small", 4)].cost_per_hour == 4.0
    assert [row.count for row in rows if row.instance_type == "ml.big"] == [1]
    assert _warm(table[("ml.big", 1)]) == 1.0
    assert table[("ml.huge", 1)].status == "skipped" and table[("ml.huge", 1)].result is None
    assert table[("ml.tiny", 0)].status == "does-not-fit" and "a needs 10 bytes" in table[("ml.tiny", 0)].reasons[0]
    # Without prices nothing is cheapest; each type still stops at its first fleet that meets the target.
    rows, best = search(loads, shapes, requests, max_count=5)
    fewest: dict[str, int] = {}
    for row in rows:
        if row.meets_target:
            fewest[row.instance_type] = min(row.count, fewest.get(row.instance_type, row.count))
    assert best is None and fewest == {"ml.small": 4, "ml.big": 1, "ml.huge": 1}


def test_a_run_that_has_missed_the_target_stops_early_and_says_so() -> None:
    # Room for one of two alternating models: every request after the first loads. With 1% allowed
    # cold of 100 counted requests, the run stops at the second cold request.
    loads = models("a", "b")
    requests = Requests([float(i) for i in range(100)], [i % 2 for i in range(100)], warmup_seconds=0.0, seed=0,
                        seconds=100.0)
    rows, _ = search(loads, [InstanceShape("ml.small", 12, 100)], requests, max_count=1)
    (row,) = rows
    assert not _ran(row).complete and _ran(row).requests == 2 and not row.meets_target
    assert "stopped after 2 counted requests (more than 1.0% of the run's already cold)" in row.reasons[-1]
    assert row.as_json()["complete"] is False


def test_slack_makes_a_model_that_only_just_fits_miss_the_target() -> None:
    loads = models("a", size=19)
    requests = Requests([float(i) for i in range(100)], [0] * 100, warmup_seconds=5.0, seed=0, seconds=100.0)
    rows, _ = search(loads, [InstanceShape("ml.small", 20, 100)], requests, max_count=1)
    assert not rows[0].meets_target and "do not fit with 10% slack" in rows[0].reasons[-1]
    rows, _ = search(loads, [InstanceShape("ml.small", 20, 100)], requests, max_count=1,
                     target=Target(gpu_slack=0.0))
    assert rows[0].meets_target


def test_a_fleet_busier_than_its_gpus_misses_the_target_however_warm() -> None:
    # One model, 1 s of GPU per request, a request every 0.5 s: one instance is busy 200% of the time.
    loads = models("a", service=1.0)
    requests = Requests([i * 0.5 for i in range(400)], [0] * 400, warmup_seconds=10.0, seed=0, seconds=200.0)
    rows, _ = search(loads, [InstanceShape("ml.small", 20, 100)], requests, max_count=1)
    assert _warm(rows[0]) == 1.0 and _ran(rows[0]).busy_share == pytest.approx(2.0, rel=0.01)
    assert not rows[0].meets_target and "queue without bound" in rows[0].reasons[0]
    # Two: each GPU busy all the time (no room for a burst); three: busy two thirds of the time. The
    # model spilled to a second instance in the warm-up, and the two then take turns without queueing
    # (a request every 0.5 s, 1 s each): the third holds nothing.
    rows, _ = search(loads, [InstanceShape("ml.small", 20, 100)], requests, max_count=3)
    assert [(row.count, row.meets_target) for row in rows] == [(1, False), (2, False), (3, True)]
    assert _ran(rows[2]).resident == [["a"], ["a"], []] and _ran(rows[2]).busy_share == pytest.approx(2 / 3, rel=0.01)
