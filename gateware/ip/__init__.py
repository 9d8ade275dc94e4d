"""IPv4 (RFC 791): receive checks and demultiplexing, transmit framing."""
