"""pgrace.drivers: see docs/architecture.md."""
