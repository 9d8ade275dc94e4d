"""The CM's wire layouts (DETH, MAD header, CM messages, cma_hdr in gateware.headers)
against the independent model sim.models.ib_cm: every field at the model's offset, and
values read back through the layouts from the model's bytes."""

import random

import pytest
from amaranth.lib import data

from gateware.headers import (
    CM_DREP,
    CM_DREQ,
    CM_MRA,
    CM_REJ,
    CM_REP,
    CM_REQ,
    CM_RTU,
    CMA_HEADER,
    DETH,
    GSI_QKEY,
    MAD,
    MAD_BYTES,
    MAD_HEADER,
    CmAttribute,
)
from sim.models import ib_cm

LAYOUTS = {"REQ": CM_REQ, "MRA": CM_MRA, "REJ": CM_REJ, "REP": CM_REP, "RTU": CM_RTU,
           "DREQ": CM_DREQ, "DREP": CM_DREP}


def reserved(name):
    return name.startswith("reserved") or "_reserved" in name


def read(layout, wire):
    """A constant of ``layout`` over wire bytes (first byte first)."""
    assert len(wire) == layout.length
    return data.Const(layout, int.from_bytes(wire, "big"))


@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_fields_where_the_model_puts_them(kind):
    layout, model = LAYOUTS[kind], ib_cm.CM_MESSAGES[kind]
    assert layout.length == ib_cm.CM_BYTES
    named = {name for name, _ in layout if not reserved(name)}
    assert named == set(model), named ^ set(model)
    for name, field in model.items():
        start = 8 * field.byte + field.bit
        assert layout.bit_span(name) == (start, start + field.width), name


@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_values_through_the_layouts(kind):
    rng = random.Random(kind)
    layout = LAYOUTS[kind]
    for _ in range(5):
        values = {name: (rng.randbytes(field.width // 8) if name in ib_cm.BYTES_FIELDS
                         else rng.getrandbits(field.width))
                  for name, field in ib_cm.CM_MESSAGES[kind].items()}
        view = read(layout, ib_cm.cm_message(kind, **values))
        for name, value in values.items():
            if isinstance(value, bytes):
                value = int.from_bytes(value, "big")
            assert view[name] == value, name
        for name, _ in layout:
            if reserved(name):
                assert view[name] == 0, name


def test_mad_header_and_attributes():
    message = ib_cm.cm_message("RTU", local_comm_id=1)
    datagram = ib_cm.mad("RTU", message, transaction_id=0x8877665544332211,
                         attribute_modifier=0xDEADBEEF, status=0x1234, class_specific=0x5678)
    assert len(datagram) == MAD_BYTES == ib_cm.MAD_BYTES
    header = read(MAD_HEADER, datagram[:MAD_HEADER.length])
    assert (header.base_version, header.mgmt_class, header.class_version) == (1, 0x07, 2)
    assert (header.response, header.method) == (0, 0x03)
    assert (header.status, header.class_specific) == (0x1234, 0x5678)
    assert header.transaction_id == 0x8877665544332211
    assert header.attribute_id == CmAttribute.RTU
    assert header.attribute_modifier == 0xDEADBEEF
    assert MAD_HEADER.length == ib_cm.MAD_HEADER_FORMAT.size
    whole = read(MAD, datagram)
    assert whole.header.transaction_id == 0x8877665544332211
    assert read(CM_RTU, whole.data.to_bytes(CM_RTU.length, "big")).local_comm_id == 1
    for kind, attribute in ib_cm.ATTRIBUTE_IDS.items():
        assert CmAttribute[kind] == attribute


def test_deth_and_cma_header():
    deth = read(DETH, ib_cm.deth(src_qp=0xABCDEF))
    assert (deth.qkey, deth.reserved, deth.src_qp) == (GSI_QKEY, 0, 0xABCDEF)
    assert GSI_QKEY == ib_cm.GSI_QKEY
    cma = read(CMA_HEADER, ib_cm.cma_header(src_ip="10.77.0.1", dst_ip="10.77.0.2",
                                            port=0xBEEF))
    assert (cma.cma_version, cma.ip_version, cma.port) == (0, 4, 0xBEEF)
    assert cma.src_addr == 0x0A4D0001 and cma.dst_addr == 0x0A4D0002
