"""Examples of user logic on the core's ports: :mod:`.event_source` (a detector-like data
source of RDMA WRITEs with immediate into a host's ring) and :mod:`.event_core` (that
source beside the core, as a board top builds it)."""
