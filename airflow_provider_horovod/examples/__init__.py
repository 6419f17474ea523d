"""Example training code that ships with the provider (and so travels with every job)."""
