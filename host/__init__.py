"""Host tools of the RoCEv2 endpoint: ``qp-server`` pairs host RC QPs with the
endpoint's QPs over the connection manager (UDP 17185), starts the endpoint's
traffic generator and checks every byte that lands in host memory; the receive
API (:mod:`host.receive`) hands the landed messages to the user's own code."""
