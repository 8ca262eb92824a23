"""defenses."""
