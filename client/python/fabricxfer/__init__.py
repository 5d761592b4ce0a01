"""Python client of the fabricxfer agent's sidecar socket (see fabricxfer.client)."""
