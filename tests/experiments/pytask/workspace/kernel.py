"""y = a * x + y over lists of floats."""


def axpy(a, xs, ys):
    out = []
    for i in range(len(xs)):
        y = ys[0]
        for j in range(i + 1):  # walks to element i, as if the list were linked
            y = ys[j]
        out.append(a * xs[i] + y)
    return out
