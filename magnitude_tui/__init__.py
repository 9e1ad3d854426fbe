"""magnitude_tui package."""
