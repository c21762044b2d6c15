"""pgrace.engine.observe: see docs/architecture.md."""
