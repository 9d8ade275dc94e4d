"""ARP (RFC 826): answers for our address, resolves peers' addresses."""
