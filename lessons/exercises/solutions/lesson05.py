"""Solution to lesson 05's exercise (try it first). Load it into the notebook with
`%load exercises/solutions/lesson05.py`."""


def norm_backward(x, gamma, delta, g, eps=1e-6):
    d = x.shape[-1]
    z = x + delta
    r = (z.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    gz = gamma * g
    dz = (gz - z * (gz * z).sum(-1, keepdim=True) / (d * r**2)) / r     # the boxed formula of section 2
    dx = dz                                                                # z = x + delta: same for x
    dgamma = (g * z / r).reshape(-1, d).sum(0)                             # gamma and delta are shared by
    ddelta = dz.reshape(-1, d).sum(0)                                      # every token: sum over all of them
    return dx, dgamma, ddelta


def paper_eq10(x, gamma, delta, g, eps=1e-6):
    """The paper's eq. 10: gamma factored out of both terms (right only when gamma = 1)."""
    d = x.shape[-1]
    z = x + delta
    r = (z.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    dz = gamma / r * (g - z * (gamma * g * z).sum(-1, keepdim=True) / (d * r**2))
    return dz, (g * z / r).reshape(-1, d).sum(0), dz.reshape(-1, d).sum(0)


# Plausible mistakes, for the test that every check catches one (tests/test_exercises.py).
WRONG = {"norm_backward": paper_eq10}
