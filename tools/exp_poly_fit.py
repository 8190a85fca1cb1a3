#!/usr/bin/python3
"""exp_poly_fit.py - derives the polynomial of the SIMD exp (src/kernels/cpu/cpu_impl.h).

e^x = 2^n e^r with n = round(x / ln 2), |r| <= ln2 / 2, and e^r = 1 + r + r^2 P(r) with P of
degree 5 fitted to (e^r - 1 - r) / r^2. The fit is least squares on Chebyshev nodes, weighted
by r^2 / e^r (an error dP in P is an error r^2 dP in e^r, relative to e^r), then reweighted a
few rounds (Lawson) toward the minimax solution. Prints the coefficients as C hex floats and
the error of a float32 emulation of the whole exp against float64 exp.

    /usr/bin/python3 tools/exp_poly_fit.py
"""
import numpy as np

DEG = 5
HALF_LN2 = np.log(2.0) / 2
LN2_HI = np.float32(float.fromhex("0x1.62e4p-1"))


def fit():
    n = 4000
    r = HALF_LN2 * np.cos(np.pi * (np.arange(n) + 0.5) / n)
    f = (np.expm1(r) - r) / r ** 2
    w = r ** 2 / np.exp(r)
    a = np.vstack([r ** i for i in range(DEG + 1)]).T
    lw = np.ones(n)
    c = None
    for _ in range(30):
        c, *_ = np.linalg.lstsq(a * (w * lw)[:, None], f * w * lw, rcond=None)
        e = np.abs((a @ c - f) * w)
        lw = lw * np.sqrt(e) + 1e-300
        lw /= lw.max()
    model = np.max(np.abs(1 + r + r * r * (a @ c) - np.exp(r)) / np.exp(r))
    return c.astype(np.float32), model


def exp32(x, c):
    """The kernel's arithmetic in float32 (without FMA: a slightly pessimistic emulation)."""
    x = x.astype(np.float32)
    n = np.round(x * np.float32(1 / np.log(2)))
    lo = np.float32(np.log(2) - float(LN2_HI))
    r = (x - n * LN2_HI).astype(np.float32)
    r = (r - n * lo).astype(np.float32)
    p = np.full_like(r, c[DEG])
    for i in range(DEG - 1, -1, -1):
        p = (p * r + c[i]).astype(np.float32)
    y = ((p * (r * r)).astype(np.float32) + r).astype(np.float32) + np.float32(1)
    return np.ldexp(y.astype(np.float64), n.astype(int))


def main():
    c, model = fit()
    for i, v in enumerate(c):
        print("P%d = %s  (%.10g)" % (i, float(v).hex(), v))
    print("model max relative error: %.3g" % model)
    xs = np.linspace(-87, 88, 2000001).astype(np.float32)
    t = np.exp(xs.astype(np.float64))
    print("float32 emulation max relative error: %.3g" % np.max(np.abs(exp32(xs, c) - t) / t))


if __name__ == "__main__":
    main()
