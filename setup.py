"""Package list for the `infra_agent` distribution.

The repository root is the package `infra_agent` (see `package-dir` in pyproject.toml); this file
only lists its sub-packages, which `find:` in pyproject cannot prefix with the package name, and
keeps itself out of the wheel.
"""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ARCHITECTURE = [
    "agent", "tools", "feedback", "sandboxes", "tasks", "store", "judgement",
    "review", "trajectories", "experiments", "serving", "evals", "cli",
]  # fmt: skip


class BuildPy(build_py):
    """build_py that leaves this setup.py (which sits in the package root) out of the wheel."""

    def find_package_modules(self, package, package_dir):  # type: ignore[no-untyped-def]
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if not (package == "infra_agent" and m[1] == "setup")]


subpackages = find_packages(where=".", include=[f"{name}*" for name in ARCHITECTURE])
setup(
    packages=["infra_agent"] + [f"infra_agent.{p}" for p in subpackages],
    cmdclass={"build_py": BuildPy},
)
