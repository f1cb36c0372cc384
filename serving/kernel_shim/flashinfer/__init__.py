"""infra-agent's CPU stand-in for the flashinfer package: absent (see ../sgl_kernel_cpu_shim.py).

flashinfer is CUDA-only, yet the installed package imports on a machine without a GPU, and
sgl_kernel and SGLang try it at start-up (`try: import flashinfer.norm`), which cost about 5 of
a tiny CPU server's 31 CPU-seconds to start (py-spy over a start; its module-level
`torch.compile` pulls in dynamo) for nothing the CPU engine runs. Every SGLang import of it on
the CPU path is guarded, so it takes the no-flashinfer branch.
"""

raise ImportError("flashinfer is CUDA-only; infra-agent's CPU shim leaves it out (no GPU here)")
