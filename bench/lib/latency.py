"""What the Python benches share: percentiles (linear between ranks) of a list of times,
the p50/p90/p99 summary they print, and milliseconds since a monotonic start."""

import time


def pct(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return round(xs[f] + (xs[c] - xs[f]) * (k - f), 1)


def stats(xs):
    return {"runs": len(xs), "p50": pct(xs, 50), "p90": pct(xs, 90), "p99": pct(xs, 99)}


def ms(start):
    return (time.monotonic() - start) * 1000
