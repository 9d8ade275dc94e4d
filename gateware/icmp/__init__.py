"""ICMP (RFC 792): echo replies."""
