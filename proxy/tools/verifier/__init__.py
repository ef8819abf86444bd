"""Offline training of the pair verifier shipped in ``proxy.verify`` (needs the ``train`` extra)."""
