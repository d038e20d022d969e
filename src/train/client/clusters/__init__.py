"""Cluster profiles: site rules for Gilbreth, Rivanna/Afton, Torch and the local test cluster."""
