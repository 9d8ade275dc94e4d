"""Parallel CRC: the register update for a chunk of bytes as matrices over GF(2).

A CRC register is updated linearly: after a chunk of ``N`` data bytes,
``register' = A_N · register ⊕ B_N · data``, where ``data`` is the chunk as
an ``8·N``-bit vector with byte lane 0 (the first byte on the wire) in bits
0 to 7, the order of the packet streams. :class:`ParallelCrc` derives
``A_N`` and ``B_N`` from :class:`amaranth.lib.crc.Parameters` alone, through
a bit-serial model of the register; ``A_N`` is invertible, so zero bytes
processed past the end of a message can be taken back out with ``A_N⁻¹``.

The register is an integer whose bit ``i`` holds the coefficient of ``x^i``
(the most significant bit is the highest-order term), as in
:meth:`amaranth.lib.crc.Parameters.compute`; the initial value, the input
reflection and the output reflection and XOR have their usual sense.

In logic, :meth:`Matrix.apply` makes each output bit one flat XOR of the
input bits it depends on, which synthesis maps to a balanced LUT tree (a
512-bit chunk is about four LUT6 levels), never a chain of per-bit steps.
"""

from amaranth import *
from amaranth.lib import crc

__all__ = ["Matrix", "ParallelCrc"]


class Matrix:
    """A matrix over GF(2).

    Parameters
    ----------
    rows : iterable of int
        Row ``i`` as an integer whose bit ``j`` is the coefficient of input bit
        ``j`` in output bit ``i``.
    columns : int
        Number of input bits.
    """

    def __init__(self, rows, columns):
        self._rows = tuple(rows)
        self._columns = columns
        if any(row >> columns for row in self._rows):
            raise ValueError(f"A row has bits beyond column {columns}")

    @classmethod
    def identity(cls, size):
        return cls((1 << index for index in range(size)), size)

    @classmethod
    def from_columns(cls, columns, height):
        """The matrix whose column ``j`` is the integer ``columns[j]`` (``height`` bits)."""
        columns = list(columns)
        return cls((sum(((column >> row) & 1) << index for index, column in enumerate(columns))
                    for row in range(height)), len(columns))

    @property
    def rows(self):
        return self._rows

    @property
    def shape(self):
        """``(output bits, input bits)``."""
        return len(self._rows), self._columns

    def __eq__(self, other):
        return isinstance(other, Matrix) and (self.rows, self.shape) == (other.rows, other.shape)

    def __hash__(self):
        return hash((self._rows, self._columns))

    def __repr__(self):
        return f"Matrix({len(self._rows)}×{self._columns})"

    def __matmul__(self, other):
        """Product with a :class:`Matrix`, or with a bit vector given as an integer."""
        if isinstance(other, Matrix):
            if other.shape[0] != self._columns:
                raise ValueError(f"Cannot multiply {self!r} by {other!r}")
            products = []
            for row in self._rows:
                product = 0
                for index, other_row in enumerate(other.rows):
                    if (row >> index) & 1:
                        product ^= other_row
                products.append(product)
            return Matrix(products, other.shape[1])
        if isinstance(other, int):
            if other < 0 or other >> self._columns:
                raise ValueError(f"Vector {other:#x} does not fit {self._columns} bits")
            return sum(((row & other).bit_count() & 1) << index
                       for index, row in enumerate(self._rows))
        return NotImplemented

    def inverse(self):
        """The inverse, by Gauss-Jordan elimination; ``ValueError`` if there is none."""
        size = len(self._rows)
        if size != self._columns:
            raise ValueError(f"Only a square matrix has an inverse, not {self!r}")
        # Each row carries its row of the identity above bit `size`.
        rows = [row | (1 << (size + index)) for index, row in enumerate(self._rows)]
        for column in range(size):
            pivot = next((index for index in range(column, size) if (rows[index] >> column) & 1),
                         None)
            if pivot is None:
                raise ValueError(f"{self!r} is singular")
            rows[column], rows[pivot] = rows[pivot], rows[column]
            for index in range(size):
                if index != column and (rows[index] >> column) & 1:
                    rows[index] ^= rows[column]
        return Matrix((row >> size for row in rows), size)

    def __pow__(self, exponent):
        """Power by repeated squaring; a negative exponent is a power of the inverse."""
        base = self.inverse() if exponent < 0 else self
        result = Matrix.identity(self._columns)
        for bit in reversed(range(abs(exponent).bit_length())):
            result = result @ result
            if (abs(exponent) >> bit) & 1:
                result = result @ base
        return result

    def apply(self, value):
        """The product with a :class:`Value` as logic: each output bit is one flat XOR of
        the input bits its row selects (``(value & row).xor()``; synthesis drops the bits
        the constant clears, and the simulator computes it as one parity)."""
        value = Value.cast(value)
        if len(value) != self._columns:
            raise ValueError(f"{self!r} takes {self._columns} bits, not {len(value)}")
        return Cat((value & row).xor() for row in self._rows)


class ParallelCrc:
    """The register of a byte-oriented CRC as linear maps.

    Parameters
    ----------
    parameters : :class:`amaranth.lib.crc.Parameters` or :class:`amaranth.lib.crc.Algorithm`
        The CRC, with 8-bit data words (an algorithm is taken with 8-bit words).
    """

    def __init__(self, parameters):
        if isinstance(parameters, crc.Algorithm):
            parameters = parameters(8)
        if not isinstance(parameters, crc.Parameters):
            raise TypeError(f"CRC parameters must be amaranth.lib.crc.Parameters, "
                            f"not {parameters!r}")
        if parameters.data_width != 8:
            raise ValueError(f"CRC data words must be bytes, not {parameters.data_width} bits")
        self._algorithm = parameters.algorithm
        self._matrices = {}

    @property
    def algorithm(self):
        return self._algorithm

    @property
    def width(self):
        """Bits of the register."""
        return self._algorithm.crc_width

    @property
    def initial(self):
        """The register before any data."""
        return self._algorithm.initial_crc

    def process(self, register, data):
        """The register after the bytes ``data``, one bit at a time: the model the
        matrices are derived from."""
        algorithm = self._algorithm
        top = self.width - 1
        mask = (1 << self.width) - 1
        for byte in data:
            for bit in range(8):
                data_bit = (byte >> (bit if algorithm.reflect_input else 7 - bit)) & 1
                feedback = ((register >> top) & 1) ^ data_bit
                register = (register << 1) & mask
                if feedback:
                    register ^= algorithm.polynomial
        return register

    def finalize(self, register):
        """The CRC of a register (an integer): reflected and XORed as the parameters say."""
        if self._algorithm.reflect_output:
            register = int(f"{register:0{self.width}b}"[::-1], 2)
        return register ^ self._algorithm.xor_output

    def finalize_value(self, register):
        """:meth:`finalize` as logic, for a :class:`Value` of :attr:`width` bits (wiring
        and inverters only)."""
        register = Value.cast(register)
        if len(register) != self.width:
            raise ValueError(f"The register has {self.width} bits, not {len(register)}")
        if self._algorithm.reflect_output:
            register = register[::-1]
        return register ^ self._algorithm.xor_output

    def compute(self, data):
        """The CRC of ``data`` (bytes), from the initial register."""
        return self.finalize(self.process(self.initial, data))

    def matrices(self, chunk_bytes):
        """``(A, B)`` with ``register' = A @ register ^ B @ data`` after ``chunk_bytes``
        bytes; ``data`` has lane 0 (the first byte processed) in its bits 0 to 7."""
        if not isinstance(chunk_bytes, int) or chunk_bytes < 0:
            raise ValueError(f"Chunk length must be a non-negative integer, not {chunk_bytes!r}")
        if chunk_bytes not in self._matrices:
            # One byte from the bit-serial model; byte k of a chunk of N then meets
            # N − 1 − k more byte updates of the register: its columns are A₁^(N−1−k)·B₁.
            per_byte = Matrix.from_columns(
                (self.process(1 << bit, b"\0") for bit in range(self.width)), self.width)
            byte_columns = [self.process(0, bytes([1 << bit])) for bit in range(8)]
            columns = []
            for _ in range(chunk_bytes):
                columns[:0] = byte_columns
                byte_columns = [per_byte @ column for column in byte_columns]
            self._matrices[chunk_bytes] = (per_byte ** chunk_bytes,
                                           Matrix.from_columns(columns, self.width))
        return self._matrices[chunk_bytes]

    def advance(self, chunk_bytes):
        """``A`` of :meth:`matrices`: the register's update over ``chunk_bytes`` zero bytes.
        Its inverse takes zero bytes back out of the register."""
        return self.matrices(chunk_bytes)[0]
