"""Grafana dashboards as Python code, written to committed JSON files.

Each dashboard is one module that returns a grafana-foundation-sdk builder; ``catalogue`` lists
them, ``output`` turns them into stable JSON, and ``python -m dashboards`` writes the files (or,
with ``--check``, fails when the committed files differ from what the code generates). Shared
pieces -- the datasource reference, variables, panel builders, annotations -- live in their own
modules so that a component's dashboard (batcher, predictor, autoscaler) is one new module.
"""
