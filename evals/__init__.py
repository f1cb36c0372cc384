"""Evaluations: policies and models over a suite of tasks, attempts as records, metrics, reports."""
