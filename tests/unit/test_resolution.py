"""What a resolution says, merged with the last good answer, and how an upstream's set changes
(``sidecar/upstream/resolution.py``): ok, empty and error results, per family and per SRV target."""

from __future__ import annotations

from sidecar.upstream.resolution import (
    ALL,
    EMPTY,
    ERROR,
    HOSTS,
    OK,
    V4,
    V6,
    Diff,
    Found,
    Part,
    Resolution,
    TargetState,
    combine,
    diff,
    family_of,
    union,
)

N = "orders.prod:8080"


def found(*addresses: str, name: str = N) -> tuple[Found, ...]:
    return tuple(Found(a, name) for a in addresses)


def test_an_answer_gives_every_address_of_every_family_with_the_shortest_ttl() -> None:
    parts = [
        Part(N, V4, OK, ("10.0.0.1:8080", "10.0.0.2:8080"), 30.0),
        Part(N, V6, OK, ("[fd00::1]:8080",), 5.0),
    ]
    assert combine(parts, ()) == Resolution(
        OK, found("10.0.0.1:8080", "10.0.0.2:8080", "[fd00::1]:8080"), 5.0
    )


def test_no_address_in_any_family_is_an_empty_set_saying_why() -> None:
    parts = [Part(N, V4, EMPTY, detail="NXDOMAIN"), Part(N, V6, EMPTY, detail="NXDOMAIN")]
    assert combine(parts, found("10.0.0.1:8080")) == Resolution(EMPTY, (), None, "NXDOMAIN")
    parts = [Part(N, V4, EMPTY, detail="no A record"), Part(N, V6, EMPTY, detail="no AAAA record")]
    assert combine(parts, ()).detail == "v4: no A record; v6: no AAAA record"


def test_one_family_answering_empty_is_an_answer() -> None:
    parts = [Part(N, V4, OK, ("10.0.0.1:8080",), 5.0), Part(N, V6, EMPTY, detail="no AAAA record")]
    assert combine(parts, found("10.0.0.1:8080", "[fd00::1]:8080")) == Resolution(
        OK, found("10.0.0.1:8080"), 5.0
    )


def test_a_failed_resolution_keeps_the_last_good_set() -> None:
    before = found("10.0.0.1:8080", "10.0.0.2:8080")
    parts = [
        Part(N, V4, ERROR, detail="no answer to A within 2s"),
        Part(N, V6, ERROR, detail="no answer to A within 2s"),
    ]
    assert combine(parts, before) == Resolution(ERROR, before, None, "no answer to A within 2s")
    assert combine(parts, ()) == Resolution(ERROR, (), None, "no answer to A within 2s")  # never resolved yet


def test_a_family_that_failed_keeps_its_last_addresses_beside_the_answer_of_the_other() -> None:
    before = found("10.0.0.1:8080", "[fd00::1]:8080")
    parts = [Part(N, V4, OK, ("10.0.0.9:8080",), 5.0), Part(N, V6, ERROR, detail="SERVFAIL")]
    result = combine(parts, before)
    assert result.result == ERROR and result.detail == "SERVFAIL"  # tried again soon, on failure_refresh
    assert set(result.endpoints) == set(found("[fd00::1]:8080", "10.0.0.9:8080"))


def test_an_srv_target_that_failed_keeps_its_addresses_and_the_others_follow_their_answer() -> None:
    a, b = "a.prod:8080", "b.prod:9090"
    before = found("10.0.0.1:8080", name=a) + found("10.0.0.2:9090", name=b)
    parts = [Part(a, V4, ERROR, detail="timeout"), Part(b, V4, OK, ("10.0.0.3:9090",), 5.0)]
    result = combine(parts, before)
    assert result.result == ERROR
    assert set(result.endpoints) == {Found("10.0.0.1:8080", a), Found("10.0.0.3:9090", b)}


def test_an_srv_list_that_failed_keeps_every_endpoint() -> None:
    before = found("10.0.0.1:8080", name="a.prod:8080") + found("10.0.0.2:9090", name="b.prod:9090")
    result = combine([Part("_http._tcp.search.prod", ALL, ERROR, detail="SERVFAIL")], before)
    assert result == Resolution(ERROR, before, None, "SERVFAIL")


def test_a_name_from_etc_hosts_is_one_endpoint_under_its_name() -> None:
    parts = [Part("localhost:8080", HOSTS, OK, ("localhost:8080",))]
    assert combine(parts, ()) == Resolution(OK, found("localhost:8080", name="localhost:8080"))
    assert [family_of(a) for a in ("localhost:8080", "10.1.2.3:80", "[::1]:80")] == [HOSTS, V4, V6]


def test_a_target_state_records_how_its_resolutions_went() -> None:
    state = TargetState()
    assert not state.resolved
    assert state.apply(Resolution(OK, found("10.0.0.1:8080"), 5.0), wall=100.0)
    assert (state.resolved, state.last_result, state.last_success, state.ttl) == (True, OK, 100.0, 5.0)
    assert not state.apply(Resolution(ERROR, found("10.0.0.1:8080"), None, "timeout"), wall=105.0)
    assert (state.last_result, state.detail, state.last_attempt, state.last_success) == (
        ERROR,
        "timeout",
        105.0,
        100.0,
    )
    assert state.apply(Resolution(EMPTY, (), None, "NXDOMAIN"), wall=110.0)
    assert state.last_success == 110.0  # an empty answer is an answer


def test_an_upstreams_set_is_the_union_of_its_targets_and_a_shared_address_is_one_endpoint() -> None:
    sets = [
        found("10.0.0.1:80", "10.0.0.2:80", name="a:80"),
        found("10.0.0.2:80", "10.0.0.3:80", name="b:80"),
    ]
    assert union(sets) == [
        Found("10.0.0.1:80", "a:80"),
        Found("10.0.0.2:80", "a:80"),
        Found("10.0.0.3:80", "b:80"),
    ]


def test_a_diff_names_what_came_and_what_left_and_nothing_for_a_new_order() -> None:
    assert diff(["a", "b", "c"], ["c", "d", "a"]) == Diff(("d",), ("b",))
    assert not diff(["a", "b"], ["b", "a"])
