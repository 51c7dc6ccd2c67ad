"""How a part's ts is read: the shortcut that skips the Decimal test of short ts texts agrees with
that test, and the mode of a sample follows from its ts texts (chrome_ts._ts_mode)."""

from __future__ import annotations

import random

from slowcard.ingest.chrome_ts import _SHORT_DECIMAL, _double_exact, _ts_mode


def _texts(rng: random.Random, n: int, int_digits: int, decimals: int, lead: str = "") -> list[str]:
    out = []
    for _ in range(n):
        whole = lead + str(rng.randrange(10 ** (int_digits - 1), 10**int_digits))
        frac = "".join(rng.choice("0123456789") for _ in range(decimals))
        sign = "-" if rng.random() < 0.2 else ""
        out.append(f"{sign}{whole}.{frac}" if decimals else f"{sign}{whole}")
    return out


def test_short_decimals_are_the_ones_a_double_holds_exactly():
    rng = random.Random(7)
    checked = 0
    for int_digits in range(1, 13):
        for decimals in range(0, 4):
            for text in _texts(rng, 400, int_digits, decimals):
                assert _SHORT_DECIMAL.fullmatch(text.encode())
                assert _double_exact(text), text  # the shortcut never says yes where Decimal says no
                checked += 1
    # 13 integer digits below 8e12 (Kineto's µs since boot: 4458676523624.173 in a real trace)
    for lead in "1234567":
        for text in _texts(rng, 2000, 12, 3, lead=lead):
            assert _SHORT_DECIMAL.fullmatch(text.encode()) and _double_exact(text), text
            checked += 1
    # the texts at the edge: ...999 and ...001 fractions
    for text in ("7999999999999.999", "-7999999999999.999", "999999999999.001", "0.001", "-0.999"):
        assert _SHORT_DECIMAL.fullmatch(text.encode()) and _double_exact(text)
    assert checked == 12 * 4 * 400 + 7 * 2000


def test_the_shortcut_stops_where_doubles_stop_holding_ns():
    # from 2^43 µs (8.8e12) a double's spacing passes 1 ns: many 3-decimal texts there are not
    # exact, which is why 13-digit texts from 8 on are left to the Decimal test
    rng = random.Random(8)
    nines = _texts(rng, 2000, 12, 3, lead="9")
    assert sum(not _double_exact(t) for t in nines) > 500
    assert not any(_SHORT_DECIMAL.fullmatch(t.encode()) for t in nines + _texts(rng, 200, 12, 3, lead="8"))


def test_what_the_shortcut_leaves_to_decimal():
    # more integer digits (epoch µs) or more decimals: the Decimal test decides, and some fail it
    for text in ("1704161511420306.491", "4458676624388.7315", "1.5e3", "12.3456", "-9000000000000.5"):
        assert not _SHORT_DECIMAL.fullmatch(text.encode()), text
    assert not _double_exact("1704161511420306.491")  # a double cannot hold it: the exact path
    assert _double_exact("1704161511420306.5")  # .5 it can


def _sample(ts_texts: list[str], quoted: bool = False) -> bytes:
    q = '"' if quoted else ""
    return (",".join(f'{{"ph": "X", "name": "k", "ts": {q}{t}{q}, "dur": 1}}' for t in ts_texts)).encode()


def test_mode_of_a_sample():
    assert _ts_mode(_sample(["1234.567", "1234.568", "-3.5", "17"])) == "DOUBLE"
    # one ts a double cannot hold turns the whole part exact, after any number of short ones
    assert _ts_mode(_sample(["1234.567"] * 50 + ["1704161511420306.491"])) == "exact"
    assert _ts_mode(_sample(["1704161511420306.491"], quoted=True)) == "VARCHAR"
    assert _ts_mode(b'{"ph": "X", "ts": true, "dur": 1}') == "exact"
