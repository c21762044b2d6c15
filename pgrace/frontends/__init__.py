"""Front ends: scenario file formats that become a pgrace Scenario."""
