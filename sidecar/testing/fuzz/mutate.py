"""Format-agnostic byte mutations (the classic set: flips, interesting values, insertions of tokens that
matter to parsers, deletions, duplications, truncation, splicing)."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

INTERESTING = (
    b"\x00",
    b"\xff",
    b"\x7f",
    b"\x80",
    b"\r",
    b"\n",
    b"\r\n",
    b"\r\n\r\n",
    b" ",
    b"\t",
    b":",
    b";",
    b",",
    b"\xb2",
    b"\xc3\x28",
    b"%00",
    b"0",
    b"-1",
    b"4294967295",
    b"18446744073709551616",
    b"0x10",
    b"ffffffff",
    b"\xff\xff\xff\x7f",
    b"\x00\x00\x00\x80",
    b"\x10\x00\x00\x00",
)
_NUMBER = re.compile(rb"\d+")


def mutate(
    rng: random.Random, data: bytes, tokens: Sequence[bytes] = (), others: Sequence[bytes] = ()
) -> bytes:
    """``data`` changed by one to four random mutations; ``tokens`` are the format's own words to insert,
    ``others`` inputs to splice with."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(10)
        pos = rng.randrange(len(buf) + 1)
        if kind == 0 and buf:  # flip a bit
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif kind == 1 and buf:  # a random byte
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif kind == 2:  # an interesting value or one of the format's words
            pool = INTERESTING + tuple(tokens)
            buf[pos:pos] = rng.choice(pool)
        elif kind == 3 and buf:  # overwrite with an interesting value
            word = rng.choice(INTERESTING + tuple(tokens))
            buf[pos : pos + len(word)] = word
        elif kind == 4 and buf:  # delete a range
            buf[pos : pos + rng.randint(1, 16)] = b""
        elif kind == 5 and buf:  # duplicate a range
            start = rng.randrange(len(buf))
            chunk = bytes(buf[start : start + rng.randint(1, 64)])
            buf[pos:pos] = chunk * rng.randint(1, 4)
        elif kind == 6 and buf:  # truncate
            del buf[rng.randrange(len(buf)) :]
        elif kind == 7:  # a number made extreme
            numbers = list(_NUMBER.finditer(bytes(buf)))
            if numbers:
                m = rng.choice(numbers)
                buf[m.start() : m.end()] = rng.choice(
                    (b"0", b"99999999999999999999", b"-5", b"1" * 40, b"007")
                )
        elif kind == 8 and others:  # splice with another input
            other = rng.choice(others)
            cut = rng.randrange(len(other) + 1)
            buf[pos:] = other[cut:]
        else:  # random bytes
            buf[pos:pos] = rng.randbytes(rng.randint(1, 32))
    return bytes(buf)
