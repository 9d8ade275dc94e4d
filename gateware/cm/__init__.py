"""The connection manager on UDP port 17185 (../shared/CM_PROTOCOL.md)."""
