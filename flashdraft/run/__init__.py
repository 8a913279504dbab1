"""The run machinery: the stage contract and registry, the runner, status records, reporting, provenance."""
