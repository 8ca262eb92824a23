"""attacks."""
