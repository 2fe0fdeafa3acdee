"""Deadline arithmetic for adapters: parse an incoming timeout header, render an outgoing one."""

import pytest

from sidecar.policy.deadline import MAX_TIMEOUT_S, parse_timeout_ms, timeout_ms


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("250", 0.25),
        (b"250", 0.25),
        (" 1500 ", 1.5),
        ("0.5", 0.0005),
        (str(MAX_TIMEOUT_S * 1000), MAX_TIMEOUT_S),
    ],
)
def test_parse_timeout_ms(value, seconds):
    assert parse_timeout_ms(value) == seconds


@pytest.mark.parametrize(
    "value",
    [None, "", "abc", "250ms", "0", "-5", "nan", "inf", "-inf", str(MAX_TIMEOUT_S * 1000 + 1), "1e100"],
)
def test_unusable_timeouts_parse_to_none(value):
    assert parse_timeout_ms(value) is None


@pytest.mark.parametrize("value", ["1_000", "\u0661\u0662"])  # digit grouping; Arabic-Indic digits
def test_python_number_syntax_is_garbage_in_a_header(value):
    assert parse_timeout_ms(value) is None


@pytest.mark.parametrize(
    ("seconds", "ms"),
    [
        (0.25, 250),
        (0.2509, 250),
        (0.2999999, 299),
        (1.001, 1001),
        (0.3, 300),
        (0.0004, 0),
        (0.0, 0),
        (-1.0, 0),
    ],
)
def test_timeout_ms_rounds_down(seconds, ms):
    assert timeout_ms(seconds) == ms
