"""Boards: platform files, the CMAC hard IP (Tcl recipe and instance), the tops that put
the vendor-free core on a board, and the Vivado build (``make bitstream``)."""
