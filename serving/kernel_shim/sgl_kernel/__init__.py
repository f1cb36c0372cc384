"""infra-agent's CPU stand-in for the sgl_kernel package: see ../sgl_kernel_cpu_shim.py."""

import sgl_kernel_cpu_shim

sgl_kernel_cpu_shim.install(globals())
