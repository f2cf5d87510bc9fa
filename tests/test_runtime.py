"""The host helpers kernels' plans share (`gradkern._runtime`)."""

import random

from gradkern import _runtime


def test_magic_division_is_exact():
    """`magic`'s (m, l): x // n == ((4 x * m) >> 32) >> l, as `tl_helpers.div` computes it, for every x below 2^30
    (`magics` allows it only there), over divisors of every size: small ones, powers of two and their neighbours,
    random ones, at multiples of n and their neighbours, the top of the range and at random; m is a positive int32
    (a kernel argument)."""
    rng = random.Random(0)
    divisors = [*range(2, 600), *(2**k + e for k in range(2, 31) for e in (-1, 0, 1)),
                *(rng.randrange(2, 2**31) for _ in range(2000))]
    top = 2**30 - 1
    for n in divisors:
        m, sh = _runtime.magic(n)
        assert 0 < m < 2**31, (n, m)
        for x in (0, 1, n - 1, n, n + 1, top, top - 1, top // n * n, top // n * n - 1, rng.randrange(2**30)):
            if 0 <= x <= top:
                assert (((4 * x * m) >> 32) >> sh) == x // n, (n, x)


def test_magics_only_where_exact_and_not_by_one():
    """`magics` divides by magic numbers only where allowed (32-bit index math), below 2^30 and not by 1 (a constant
    to the compiler, whose division folds away); its pairs are `magic`'s, (0, 0) where off."""
    flags, consts = _runtime.magics((7, 1, 9, 5), (100, 100, 2**30, 2**30 - 1))
    assert flags == (True, False, False, True)
    assert consts == (*_runtime.magic(7), 0, 0, 0, 0, *_runtime.magic(5))
    assert _runtime.magics((7, 5), (10, 10), allowed=False) == ((False, False), (0, 0, 0, 0))
