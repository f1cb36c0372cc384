"""Package list for the `infra_agent` distribution.

The repository root is the package `infra_agent` (see `package-dir` in pyproject.toml); this file
only lists its sub-packages, which `find:` in pyproject cannot prefix with the package name.
"""

from setuptools import find_packages, setup

ARCHITECTURE = [
    "agent", "tools", "feedback", "sandboxes", "tasks", "store",
    "review", "trajectories", "experiments", "serving",
]  # fmt: skip

subpackages = find_packages(where=".", include=[f"{name}*" for name in ARCHITECTURE])
setup(packages=["infra_agent"] + [f"infra_agent.{p}" for p in subpackages])
