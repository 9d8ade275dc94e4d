"""The CMAC hard IP (``cmac_usplus``, created by boards/cmac_ip.py) as a Component."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from gateware.stream import BEAT_BYTES, axi_stream_signature

from .cmac_ip import CMAC_IP_NAME

__all__ = ["Cmac", "cmac_signature"]


def cmac_signature(*, width=BEAT_BYTES):
    """The ports of :class:`Cmac` (its clock, resets, streams, controls and status), as one
    signature, so that the logic around the CMAC can take them flipped."""
    return wiring.Signature({
        "tx_clk": Out(1),
        "tx_reset": Out(1),
        "rx_reset": Out(1),
        "tx": In(axi_stream_signature(width=width)),
        "rx": Out(axi_stream_signature(width=width, ready=False)),
        "rx_enable": In(1),
        "tx_enable": In(1),
        "tx_send_rfi": In(1),
        "rsfec": In(1),
        "rx_datapath_reset": In(1),
        "rx_aligned": Out(1),
        "rx_remote_fault": Out(1),
        "rsfec_am_lock": Out(4),
        "rsfec_aligned": Out(1),
        "rsfec_hi_ser": Out(1),
        "rsfec_corrected": Out(1),
        "rsfec_uncorrected": Out(1),
        "rx_bad_fcs": Out(1),
        "tx_underflow": Out(1),
        "tx_overflow": Out(1),
    })


class Cmac(wiring.Component):
    """One CMAC with its four GTY lanes, in CAUI-4 with the AXI4-Stream user interface.

    Clocks: ``tx_clk`` is the IP's TX user clock (``gt_txusrclk2``,
    322.265625 MHz); ``tx`` and every control and status port are in it. The
    receive side is in it too: the IP's ``rx_clk`` is driven from
    ``tx_clk``, so the CMAC's own receive FIFO moves frames from the
    recovered clock into it and ``rx`` needs no crossing in the fabric.
    ``init_clk`` and ``drp_clk`` are the ``init`` domain's clock (125 MHz),
    and its reset is the IP's ``sys_reset``.

    ``tx_reset`` and ``rx_reset`` are the IP's user resets (high until its
    GTs and datapaths are out of reset), in ``tx_clk``; synchronize them
    before use. ``rx_datapath_reset``, in the ``init`` domain, resets the
    GTs' receive datapath (``gtwiz_reset_rx_datapath``). ``rsfec`` turns
    Clause 91 RS-FEC on both ways (it must match the peer). ``rx`` carries
    frames without FCS, ``tuser`` set with ``tlast`` on a bad one; ``tx``
    takes frames without FCS and must not pause inside a frame. PAUSE and PFC
    frames come out on ``rx`` like any other (the core acts on them). Status, in
    ``tx_clk``: ``rx_aligned``, ``rx_remote_fault`` (levels),
    ``rsfec_am_lock`` (per lane), ``rsfec_aligned``, ``rsfec_hi_ser``
    (levels), ``rsfec_corrected`` and ``rsfec_uncorrected`` (a cycle per
    codeword).

    Parameters
    ----------
    rx_pins, tx_pins :
        The QSFP28 cage's receive and transmit lanes, four differential
        pairs each, requested with ``dir="-"``.
    refclk_pins :
        The GTY reference clock's differential pair, requested with ``dir="-"``.
    ip_name : str
        The IP's module name (:func:`~boards.cmac_ip.cmac_ip_tcl` creates it).
    init_domain : str
        The domain of ``init_clk``.
    """

    def __init__(self, *, rx_pins, tx_pins, refclk_pins, ip_name=CMAC_IP_NAME,
                 init_domain="init"):
        self._rx_pins = rx_pins
        self._tx_pins = tx_pins
        self._refclk_pins = refclk_pins
        self._ip_name = ip_name
        self._init_domain = init_domain
        super().__init__(cmac_signature())

    def elaborate(self, platform):
        m = Module()
        init_clk = ClockSignal(self._init_domain)
        bad_fcs = Signal(3)
        m.submodules.ip = Instance(
            self._ip_name,
            # GTY lanes and reference clock.
            i_gt_rxp_in=self._rx_pins.p, i_gt_rxn_in=self._rx_pins.n,
            o_gt_txp_out=self._tx_pins.p, o_gt_txn_out=self._tx_pins.n,
            i_gt_ref_clk_p=self._refclk_pins.p, i_gt_ref_clk_n=self._refclk_pins.n,
            i_gt_loopback_in=C(0, 12),
            i_gtwiz_reset_tx_datapath=0, i_gtwiz_reset_rx_datapath=self.rx_datapath_reset,
            # Clocks and resets.
            i_init_clk=init_clk, i_sys_reset=ResetSignal(self._init_domain),
            i_drp_clk=init_clk, i_core_drp_reset=0,
            i_drp_addr=C(0, 10), i_drp_di=C(0, 16), i_drp_en=0, i_drp_we=0,
            o_gt_txusrclk2=self.tx_clk, i_rx_clk=self.tx_clk,
            o_usr_tx_reset=self.tx_reset, o_usr_rx_reset=self.rx_reset,
            i_core_tx_reset=0, i_core_rx_reset=0,
            # Transmit.
            i_tx_axis_tvalid=self.tx.tvalid, o_tx_axis_tready=self.tx.tready,
            i_tx_axis_tdata=self.tx.tdata, i_tx_axis_tkeep=self.tx.tkeep,
            i_tx_axis_tlast=self.tx.tlast, i_tx_axis_tuser=self.tx.tuser,
            i_tx_preamblein=C(0, 56),
            o_tx_unfout=self.tx_underflow, o_tx_ovfout=self.tx_overflow,
            i_ctl_tx_enable=self.tx_enable, i_ctl_tx_send_rfi=self.tx_send_rfi,
            i_ctl_tx_send_lfi=0, i_ctl_tx_send_idle=0, i_ctl_tx_test_pattern=0,
            i_ctl_tx_rsfec_enable=self.rsfec,
            # Receive.
            o_rx_axis_tvalid=self.rx.tvalid, o_rx_axis_tdata=self.rx.tdata,
            o_rx_axis_tkeep=self.rx.tkeep, o_rx_axis_tlast=self.rx.tlast,
            o_rx_axis_tuser=self.rx.tuser,
            i_ctl_rx_enable=self.rx_enable, i_ctl_rx_force_resync=0, i_ctl_rx_test_pattern=0,
            i_ctl_rx_rsfec_enable=self.rsfec, i_ctl_rx_rsfec_enable_correction=self.rsfec,
            i_ctl_rx_rsfec_enable_indication=self.rsfec,
            i_ctl_rsfec_ieee_error_indication_mode=0,
            # RX flow control (PG203): no pause processing here, MAC control frames go on
            # to the core (RX_FORWARD_CONTROL_FRAMES, boards/cmac_ip.py), which reads them.
            i_ctl_rx_pause_enable=C(0, 9), i_ctl_rx_pause_ack=C(0, 9),
            **{f"i_ctl_rx_{check}_{kind}": 0
               for check in ("enable", "check_etype", "check_mcast", "check_opcode",
                             "check_sa", "check_ucast")
               for kind in ("gcp", "gpp", "pcp", "ppp")},
            o_stat_rx_aligned=self.rx_aligned, o_stat_rx_bad_fcs=bad_fcs,
            o_stat_rx_remote_fault=self.rx_remote_fault,
            **{f"o_stat_rx_rsfec_am_lock{lane}": self.rsfec_am_lock[lane] for lane in range(4)},
            o_stat_rx_rsfec_lane_alignment_status=self.rsfec_aligned,
            o_stat_rx_rsfec_hi_ser=self.rsfec_hi_ser,
            o_stat_rx_rsfec_corrected_cw_inc=self.rsfec_corrected,
            o_stat_rx_rsfec_uncorrected_cw_inc=self.rsfec_uncorrected,
        )
        m.d.comb += self.rx_bad_fcs.eq(bad_fcs != 0)
        return m
