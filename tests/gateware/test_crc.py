"""ParallelCrc and Matrix against amaranth.lib.crc's software model and zlib."""

import random
import zlib

import pytest
from amaranth import *
from amaranth.lib.crc import catalog
from amaranth.sim import Simulator

from gateware.crc import Matrix, ParallelCrc

ALGORITHMS = {
    "CRC32_ETHERNET": catalog.CRC32_ETHERNET,      # reflected
    "CRC32_BZIP2": catalog.CRC32_BZIP2,            # not reflected
    "CRC16_KERMIT": catalog.CRC16_KERMIT,          # reflected
    "CRC16_IBM_3740": catalog.CRC16_IBM_3740,      # not reflected, initial value all ones
    "CRC8_SMBUS": catalog.CRC8_SMBUS,              # not reflected
    "CRC8_MAXIM_DOW": catalog.CRC8_MAXIM_DOW,      # reflected
    "CRC5_USB": catalog.CRC5_USB,                  # narrower than a byte
    "CRC64_XZ": catalog.CRC64_XZ,                  # wider than 32 bits
}
CHUNKS = (1, 2, 3, 4, 7, 8, 64)


@pytest.fixture(params=ALGORITHMS, scope="module")
def algorithm(request):
    return ALGORITHMS[request.param]


def test_serial_model(algorithm):
    """The bit-serial register model gives the catalog's CRC, and its check value."""
    model = ParallelCrc(algorithm())
    rng = random.Random(algorithm.crc_width)
    for length in (0, 1, 2, 5, 64, 300):
        message = rng.randbytes(length)
        assert model.compute(message) == algorithm().compute(message), length
    assert model.compute(b"123456789") == algorithm().compute(b"123456789")


def test_ethernet_is_zlib():
    model = ParallelCrc(catalog.CRC32_ETHERNET)
    rng = random.Random(0)
    for length in (0, 1, 4, 64, 1500):
        message = rng.randbytes(length)
        assert model.compute(message) == zlib.crc32(message)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_matrices(algorithm, chunk):
    """``A @ register ^ B @ data`` is the register after the chunk, lane 0 first."""
    model = ParallelCrc(algorithm())
    advance, chunk_term = model.matrices(chunk)
    assert advance.shape == (model.width, model.width)
    assert chunk_term.shape == (model.width, 8 * chunk)
    rng = random.Random(f"{algorithm.crc_width}.{chunk}")
    for _ in range(20):
        register, data = rng.getrandbits(model.width), rng.randbytes(chunk)
        assert (advance @ register) ^ (chunk_term @ int.from_bytes(data, "little")) \
            == model.process(register, data)


@pytest.mark.parametrize("chunk", (4, 64))
def test_chunked_message(algorithm, chunk):
    """A message cut into chunks, the last one zero-padded and its padding taken back
    out with the inverse of ``A``: the CRC of the catalog."""
    model = ParallelCrc(algorithm())
    advance, chunk_term = model.matrices(chunk)
    rng = random.Random(f"chunked{algorithm.crc_width}.{chunk}")
    for length in (1, chunk - 1, chunk, chunk + 1, 5 * chunk + 3):
        message = rng.randbytes(length)
        padding = -length % chunk
        padded = message + bytes(padding)
        register = model.initial
        for offset in range(0, len(padded), chunk):
            data = int.from_bytes(padded[offset:offset + chunk], "little")
            register = (advance @ register) ^ (chunk_term @ data)
        register = model.advance(padding) ** -1 @ register
        assert model.finalize(register) == algorithm().compute(message), length


@pytest.mark.parametrize("chunk", (1, 4, 64))
def test_inverse(algorithm, chunk):
    """``A·A⁻¹ = A⁻¹·A = I``, and ``A⁻¹`` takes zero bytes back out of the register."""
    model = ParallelCrc(algorithm())
    advance = model.advance(chunk)
    inverse = advance.inverse()
    identity = Matrix.identity(model.width)
    assert advance @ inverse == identity
    assert inverse @ advance == identity
    assert advance ** -1 == inverse
    assert advance ** 0 == identity
    assert model.advance(1) ** chunk == advance
    rng = random.Random(chunk)
    for _ in range(10):
        register = rng.getrandbits(model.width)
        assert inverse @ model.process(register, bytes(chunk)) == register


def test_singular_matrix():
    with pytest.raises(ValueError, match="singular"):
        Matrix([0b01, 0b01], 2).inverse()
    with pytest.raises(ValueError, match="square"):
        Matrix([0b01], 2).inverse()


def test_product_shapes():
    with pytest.raises(ValueError, match="Cannot multiply"):
        Matrix.identity(2) @ Matrix.identity(3)
    with pytest.raises(ValueError, match="does not fit"):
        Matrix.identity(2) @ 0b100


def test_parameters():
    assert ParallelCrc(catalog.CRC16_KERMIT).width == ParallelCrc(catalog.CRC16_KERMIT(8)).width
    with pytest.raises(ValueError, match="bytes"):
        ParallelCrc(catalog.CRC16_KERMIT(16))
    with pytest.raises(TypeError, match="Parameters"):
        ParallelCrc("CRC32")


@pytest.mark.parametrize("name", ["CRC32_ETHERNET", "CRC16_IBM_3740"])
def test_logic(name):
    """``Matrix.apply`` and ``finalize_value`` in the simulator: one chunk of 16 bytes
    from a register, finalized, against the serial model."""
    model = ParallelCrc(ALGORITHMS[name])
    advance, chunk_term = model.matrices(16)
    register, data = Signal(model.width), Signal(8 * 16)
    result = Signal(model.width)
    m = Module()
    m.d.comb += result.eq(model.finalize_value(advance.apply(register) ^
                                               chunk_term.apply(data)))
    rng = random.Random(name)

    async def testbench(ctx):
        for _ in range(20):
            state, chunk = rng.getrandbits(model.width), rng.randbytes(16)
            ctx.set(register, state)
            ctx.set(data, int.from_bytes(chunk, "little"))
            assert ctx.get(result) == model.finalize(model.process(state, chunk))

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()
