"""Deployment: offline bundles for air-gapped appliances (``ortserve bundle``)."""
