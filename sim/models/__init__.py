"""Models from outside the design: Scapy-built RoCEv2 packets, peers (responders, a
congested switch, a faulty link), PAUSE/PFC frames and the DCQCN reference model."""
