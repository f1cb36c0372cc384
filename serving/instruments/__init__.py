"""Instruments on a live server while a workload runs: its processes and a load beside the
instrument (`live`), profiles and GIL traces (`tracing`), the scheduler's own step log (`steps`,
records in `step_report`), an engine function's real arguments (`capture`, the hook that runs in
the server: `capture_hook`), the sampling path's precision (`precision`) and a slowdown localized
by measurement (`diagnosis`)."""
