"""UDP (RFC 768): demultiplexing to services by port, and transmit framing."""
