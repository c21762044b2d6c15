"""pgrace.model.scenario: see docs/architecture.md."""
