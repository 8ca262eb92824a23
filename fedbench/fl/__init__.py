"""The FL simulation: protocols, local training, defense hooks and observation points."""
